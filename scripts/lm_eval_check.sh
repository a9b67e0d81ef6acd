#!/usr/bin/env bash
# lm-evaluation-harness against `kvslim serve`, one server per KV policy.
#
# Creates a venv, installs `lm-eval[api]` from PyPI (no torch: the
# `local-completions` model talks HTTP and, with `tokenizer_backend=remote`,
# tokenizes through the server's /tokenize), writes two task YAMLs over the
# local COPA file (the hub is not needed), and for each policy:
#   1. starts `kvslim serve --policy P` on the default model,
#   2. runs a log-likelihood task (multiple choice, `acc`/`acc_norm`) and a
#      generation task (greedy, `exact_match`) with lm-eval,
#   3. scores the same items with `kvslim eval --mode prefill` and checks
#      that lm-eval's `acc` equals kvslim's and that the mean summed log-prob
#      of the gold continuations (from lm-eval's samples) equals kvslim's
#      `gold_logprob` within 1e-4.
# Not part of .ci/run (slow: a pip install and two model runs per policy).
#
#   bash scripts/lm_eval_check.sh                # needs cargo build --release -p kvslim
#   LIMIT=100 POLICIES='full;h2o:heavy=8,recent=8,prefill=stream:8' bash scripts/lm_eval_check.sh
#
# Why `kvslim eval --mode prefill`: the server scores an `echo` prompt with
# one prefill of context + continuation (every position's logits), which
# is that mode; the default `decode` mode feeds one token at a time.
# Why `--kv-page-size 0`: `kvslim eval` runs `full` on fixed slots; the
# server would otherwise page it (same values up to float rounding).
# The policy travels as the server's `--policy` (the default for requests
# without `kv_policy`): lm-eval's loglikelihood requests carry no extra
# fields, and `--model_args` splits on commas, which policy specs contain.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SHARED=${KVSLIM_SHARED:-$ROOT/../shared}
BIN=${BIN:-$ROOT/target/release/kvslim}
WORK=${WORK:-$ROOT/target/lm-eval}
VENV=${VENV:-$WORK/venv}
MODEL=${MODEL:-smollm2-135m}
LIMIT=${LIMIT:-40}
# `;`-separated server policies and the `kvslim eval` family + budget that
# resolves to each (budget `-`: none)
POLICIES=${POLICIES:-full;h2o:heavy=4,recent=4,prefill=stream:4}
FAMILIES=${FAMILIES:-full|-;h2o:prefill=stream:4|8}
COPA=$SHARED/data/copa/copa.jsonl

[ -x "$BIN" ] || { echo "error: $BIN missing; run cargo build --release -p kvslim" >&2; exit 1; }
[ -f "$COPA" ] || { echo "error: $COPA missing" >&2; exit 1; }
mkdir -p "$WORK"
if ! "$VENV/bin/python" -c "import lm_eval, tenacity" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "lm-eval[api]"
fi
"$VENV/bin/python" -c 'import importlib.metadata as m; print("lm-eval", m.version("lm_eval"))'

TASKS=$WORK/tasks
mkdir -p "$TASKS"
cat > "$TASKS/kvslim_copa.yaml" <<EOF
# COPA from ../shared/data as multiple choice: context "{query}", choices
# " {choice}" (lm-eval's default target_delimiter), acc = highest summed
# log-prob of the continuation, acc_norm = per character of the choice
task: kvslim_copa
dataset_path: json
dataset_kwargs:
  data_files:
    validation: $COPA
validation_split: validation
output_type: multiple_choice
doc_to_text: "{{query}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{gold}}"
metric_list:
  - metric: acc
  - metric: acc_norm
EOF
cat > "$TASKS/kvslim_copa_gen.yaml" <<EOF
# The same items as greedy generation: does the model write the right
# effect after the premise (exact match, case and punctuation ignored)?
task: kvslim_copa_gen
dataset_path: json
dataset_kwargs:
  data_files:
    validation: $COPA
validation_split: validation
output_type: generate_until
doc_to_text: "{{query}}"
doc_to_target: "{{choices[gold]}}"
generation_kwargs:
  until: ["\n", "."]
  max_gen_toks: 16
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
EOF

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null || true' EXIT

IFS=';' read -r -a POLS <<< "$POLICIES"
IFS=';' read -r -a FAMS <<< "$FAMILIES"
[ ${#POLS[@]} -eq ${#FAMS[@]} ] || { echo "error: POLICIES and FAMILIES differ in length" >&2; exit 1; }
status=0
for i in "${!POLS[@]}"; do
  P=${POLS[$i]}
  FAM=${FAMS[$i]%|*}
  BUDGET=${FAMS[$i]#*|}
  OUT=$WORK/run$i
  rm -rf "$OUT"
  mkdir -p "$OUT"
  echo "== policy $P"
  PORT=$(free_port)
  "$BIN" serve --model "$MODEL" --policy "$P" --kv-page-size 0 --port "$PORT" 2> "$OUT/serve.log" &
  PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$VENV/bin/lm-eval" run --model local-completions \
    --model_args "base_url=http://127.0.0.1:$PORT/v1/completions,model=$MODEL,tokenizer_backend=remote,max_retries=1" \
    --tasks kvslim_copa,kvslim_copa_gen --include_path "$TASKS" --limit "$LIMIT" \
    --output_path "$OUT/lm-eval" --log_samples 2> "$OUT/lm-eval.log" | tee "$OUT/lm-eval.txt"
  kill $PID
  wait $PID 2>/dev/null || true
  PID=
  if [ "$BUDGET" = "-" ]; then BUDGETS=100%; else BUDGETS=$BUDGET; fi
  "$BIN" eval --model "$MODEL" --tasks "mc:$COPA,limit=$LIMIT" --policies "$FAM" --budgets "$BUDGETS" \
    --mode prefill --no-compare-full --out "$OUT/kvslim-eval" 2> "$OUT/kvslim-eval.log" > /dev/null
  "$VENV/bin/python" - "$OUT" "$P" <<'PY' || status=1
import glob, json, sys
out, policy = sys.argv[1], sys.argv[2]
res = json.load(open(sorted(glob.glob(f"{out}/lm-eval/**/results_*.json", recursive=True))[-1]))["results"]
lm = res["kvslim_copa"]
row = [json.loads(l) for l in open(f"{out}/kvslim-eval/results.jsonl")][-1]
kv = row["metrics"]
print(f"policy {policy}: lm-eval acc {lm['acc,none']:.4f} acc_norm {lm['acc_norm,none']:.4f} | "
      f"kvslim eval ({row['policy']}, budget {row['budget']}) acc {kv['acc']:.4f} acc_norm {kv['acc_norm']:.4f} | "
      f"generation exact_match {res['kvslim_copa_gen']['exact_match,none']:.4f}")
# the mean summed log-prob of the gold continuation: kvslim's gold_logprob
samples = sorted(glob.glob(f"{out}/lm-eval/**/samples_kvslim_copa_2*.jsonl", recursive=True))[-1]
golds = [float(d["filtered_resps"][int(d["target"])][0]) for d in map(json.loads, open(samples))]
gold = sum(golds) / len(golds)
print(f"policy {policy}: gold log-prob (mean over {len(golds)} items) lm-eval {gold:.6f} | kvslim eval {kv['gold_logprob']:.6f}")
if abs(lm["acc,none"] - kv["acc"]) > 1e-9 or abs(gold - kv["gold_logprob"]) > 1e-4:
    print(f"MISMATCH for {policy}")
    sys.exit(1)
PY
done
[ $status -eq 0 ] && echo "lm-eval check: acc and gold log-probs equal to kvslim eval under every policy"
exit $status
