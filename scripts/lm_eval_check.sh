#!/usr/bin/env bash
# lm-evaluation-harness against `kvslim serve`, one server per KV policy.
#
# Creates a venv, installs `lm-eval[api]` from PyPI (no torch: the
# `local-completions` model talks HTTP and, with `tokenizer_backend=remote`,
# tokenizes through the server's /tokenize), writes task YAMLs over local
# files (the hub is not needed), and for each policy:
#   1. starts `kvslim serve --policy P` on MODEL,
#   2. runs the suite's tasks with lm-eval,
#   3. scores the same items with `kvslim eval --mode prefill` and checks,
#      task by task, that lm-eval's `acc` equals kvslim's and that the mean
#      summed log-prob of the gold continuations (from lm-eval's samples)
#      equals kvslim's `gold_logprob` within 1e-4.
# Suites (SUITE=):
#   copa     (default) two YAMLs of ours over the local COPA file: a
#            log-likelihood task (multiple choice, `acc`/`acc_norm`) and a
#            greedy generation task (`exact_match`);
#   harness  lm-eval's OWN task definitions, arc_easy and piqa: prompt,
#            choices, target and metrics come from the installed package's
#            YAMLs, which ours `include:`; only the dataset is pointed at
#            ../shared/data (the same items, written with the hub datasets'
#            fields).
# Not part of .ci/run (slow: a pip install and two model runs per policy).
#
#   bash scripts/lm_eval_check.sh                # needs cargo build --release -p kvslim
#   LIMIT=100 POLICIES='full;h2o:heavy=8,recent=8,prefill=stream:8' FAMILIES='full|-;h2o:prefill=stream:8|16' \
#     bash scripts/lm_eval_check.sh
#   SUITE=harness MODEL=qwen2.5-coder-1.5b bash scripts/lm_eval_check.sh
#
# Why `kvslim eval --mode prefill --scoring per-choice`: the server scores
# an `echo` prompt with one prefill of context + continuation (every
# position's logits) in a session of its own, which is that mode and that
# scoring; the default `decode` mode feeds one token at a time, and the
# default `forked` scoring prefills the context once and each continuation
# after it (under eviction, or a streamed prefill, that changes what the
# continuation sees).
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
SUITE=${SUITE:-copa}
# model flags for both the server and `kvslim eval`; the harness suite
# multiplies in f32 (see docs/evaluation.md: with 8-bit activations one
# prefill of context + continuation and two chunks round differently in
# attention, and the 8-bit steps amplify that to ~0.1 nats per item on
# Qwen's K-quants, so the server and `kvslim eval` would differ by more
# than the check allows)
if [ "$SUITE" = harness ]; then FLAGS=${FLAGS---f32-activations}; else FLAGS=${FLAGS-}; fi
# `;`-separated server policies and the `kvslim eval` family + budget that
# resolves to each (budget `-`: none)
POLICIES=${POLICIES:-full;h2o:heavy=4,recent=4,prefill=stream:4}
FAMILIES=${FAMILIES:-full|-;h2o:prefill=stream:4|8}
COPA=$SHARED/data/copa/copa.jsonl
ARC=$SHARED/data/arc/arc_easy.jsonl
PIQA=$SHARED/data/piqa/piqa_llmfoundry.jsonl

[ -x "$BIN" ] || { echo "error: $BIN missing; run cargo build --release -p kvslim" >&2; exit 1; }
for f in "$COPA" "$ARC" "$PIQA"; do
  [ -f "$f" ] || { echo "error: $f missing" >&2; exit 1; }
done
mkdir -p "$WORK"
if ! "$VENV/bin/python" -c "import lm_eval, tenacity" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "lm-eval[api]"
fi
"$VENV/bin/python" -c 'import importlib.metadata as m; print("lm-eval", m.version("lm_eval"))'

TASKS=$WORK/tasks-$SUITE
rm -rf "$TASKS"
mkdir -p "$TASKS"
# per suite: the lm-eval tasks, and `lm-eval task=kvslim eval task` pairs
# (`;`-separated) whose acc and gold log-prob must agree
case "$SUITE" in
copa)
  LM_TASKS=kvslim_copa,kvslim_copa_gen
  PAIRS="kvslim_copa=mc:$COPA,limit=$LIMIT"
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
  ;;
harness)
  LM_TASKS=kvslim_arc_easy,kvslim_piqa
  PAIRS="kvslim_arc_easy=mc:$ARC,limit=$LIMIT;kvslim_piqa=mc:$PIQA,limit=$LIMIT"
  OWN=$("$VENV/bin/python" -c 'import lm_eval, os; print(os.path.join(os.path.dirname(lm_eval.__file__), "tasks"))')
  for t in arc/arc_easy piqa/piqa; do
    [ -f "$OWN/$t.yaml" ] || { echo "error: lm-eval has no $OWN/$t.yaml" >&2; exit 1; }
  done
  # the same items in the same order, with the hub datasets' fields
  "$VENV/bin/python" - "$ARC" "$PIQA" "$TASKS" <<'PY'
import json, sys
arc, piqa, out = sys.argv[1:]
def question(q, path):
    # LLM Foundry's queries are "Question: " + the dataset's field (+ "\n" in PIQA)
    if not q.startswith("Question: "):
        sys.exit(f"error: {path}: a query without the `Question: ` prefix: {q[:60]!r}")
    return q[len("Question: "):].rstrip("\n")
with open(f"{out}/arc_easy.jsonl", "w") as f:
    for i, line in enumerate(open(arc)):
        d = json.loads(line)
        labels = [chr(ord("A") + k) for k in range(len(d["choices"]))]
        f.write(json.dumps({"id": str(i), "question": question(d["query"], arc),
                            "choices": {"text": d["choices"], "label": labels},
                            "answerKey": labels[d["gold"]]}) + "\n")
with open(f"{out}/piqa.jsonl", "w") as f:
    for line in open(piqa):
        d = json.loads(line)
        f.write(json.dumps({"goal": question(d["query"], piqa), "sol1": d["choices"][0],
                            "sol2": d["choices"][1], "label": d["gold"]}) + "\n")
PY
  # lm-eval's own task NAME (from its folder DIR) over the local items in
  # $TASKS/NAME.jsonl as task kvslim_NAME: EXTRA (a YAML line, or empty),
  # then each SPLIT reading them
  local_task() {
    local name=$1 dir=$2 extra=$3 split
    shift 3
    {
      echo "# lm-eval's own $name (prompt, choices, target, metrics) over local items"
      echo "include: $OWN/$dir/$name.yaml"
      echo "task: kvslim_$name"
      if [ -n "$extra" ]; then echo "$extra"; fi
      printf 'dataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n'
      for split in "$@"; do echo "    $split: $TASKS/$name.jsonl"; done
    } > "$TASKS/kvslim_$name.yaml"
  }
  local_task arc_easy arc "tag: []" train validation test
  local_task piqa piqa "" train validation
  ;;
*)
  echo "error: unknown SUITE \`$SUITE\` (copa, harness)" >&2
  exit 2
  ;;
esac
IFS=';' read -r -a PAIR <<< "$PAIRS"
KV_TASKS=$(printf '%s;' "${PAIR[@]#*=}")

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
  OUT=$WORK/$SUITE-run$i
  rm -rf "$OUT"
  mkdir -p "$OUT"
  echo "== policy $P"
  PORT=$(free_port)
  # shellcheck disable=SC2086 # FLAGS is a list of flags
  "$BIN" serve --model "$MODEL" $FLAGS --policy "$P" --kv-page-size 0 --port "$PORT" 2> "$OUT/serve.log" &
  PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$VENV/bin/lm-eval" run --model local-completions \
    --model_args "base_url=http://127.0.0.1:$PORT/v1/completions,model=$MODEL,tokenizer_backend=remote,max_retries=1" \
    --tasks "$LM_TASKS" --include_path "$TASKS" --limit "$LIMIT" \
    --output_path "$OUT/lm-eval" --log_samples 2> "$OUT/lm-eval.log" | tee "$OUT/lm-eval.txt"
  kill $PID
  wait $PID 2>/dev/null || true
  PID=
  if [ "$BUDGET" = "-" ]; then BUDGETS=100%; else BUDGETS=$BUDGET; fi
  # shellcheck disable=SC2086
  "$BIN" eval --model "$MODEL" $FLAGS --tasks "${KV_TASKS%;}" --policies "$FAM" --budgets "$BUDGETS" \
    --mode prefill --scoring per-choice --no-compare-full --out "$OUT/kvslim-eval" 2> "$OUT/kvslim-eval.log" > /dev/null
  "$VENV/bin/python" - "$OUT" "$P" "$PAIRS" <<'PY' || status=1
import glob, json, sys
out, policy, pairs = sys.argv[1], sys.argv[2], sys.argv[3]
res = json.load(open(sorted(glob.glob(f"{out}/lm-eval/**/results_*.json", recursive=True))[-1]))["results"]
rows = [json.loads(l) for l in open(f"{out}/kvslim-eval/results.jsonl")]
for t, r in res.items():
    if "exact_match,none" in r:
        print(f"policy {policy}, {t}: generation exact_match {r['exact_match,none']:.4f}")
bad = False
for n, (lm_task, kv_spec) in enumerate(p.split("=", 1) for p in pairs.split(";")):
    lm, row = res[lm_task], rows[n]  # kvslim eval writes its tasks' rows in order
    kv = row["metrics"]
    print(f"policy {policy}, {lm_task}: lm-eval acc {lm['acc,none']:.4f} acc_norm {lm['acc_norm,none']:.4f} | "
          f"kvslim eval ({row['policy']}, budget {row['budget']}, {row['task']}) acc {kv['acc']:.4f} "
          f"acc_norm {kv['acc_norm']:.4f}")
    # the mean summed log-prob of the gold continuation: kvslim's gold_logprob
    samples = sorted(glob.glob(f"{out}/lm-eval/**/samples_{lm_task}_2*.jsonl", recursive=True))[-1]
    golds = [float(d["filtered_resps"][int(d["target"])][0]) for d in map(json.loads, open(samples))]
    gold = sum(golds) / len(golds)
    print(f"policy {policy}, {lm_task}: gold log-prob (mean over {len(golds)} items) lm-eval {gold:.6f} | "
          f"kvslim eval {kv['gold_logprob']:.6f}")
    if abs(lm["acc,none"] - kv["acc"]) > 1e-9 or abs(gold - kv["gold_logprob"]) > 1e-4:
        print(f"MISMATCH for {policy} on {lm_task}")
        bad = True
sys.exit(1 if bad else 0)
PY
done
[ $status -eq 0 ] && echo "lm-eval check ($SUITE): acc and gold log-probs equal to kvslim eval under every policy"
exit $status
