#!/usr/bin/env bash
# CHAI on Qwen2.5-Coder-1.5B (issue #34, item 5): what share of K can its
# 2 KV heads per layer give up? One GQA-aware quality calibration
# (`kvslim calibrate --max-kl`: 28 single-layer measurements of kv_keep = 1
# on 2 windows of 512 tokens from WikiText-2's second half) writes one plan
# per KL budget; each plan then runs held out on the first 1,024 tokens of
# the same file, every token a decode step, against the full cache
# (`perplexity --compare-full`), dynamic (`chai`) and static
# (`chai-static`) membership.
#
#   bash scripts/qwen_chai.sh            # THREADS=1 NICE=10 by default
#
# Writes docs/qwen/chai/plan-kl<B>.json, docs/qwen/chai/<head>-kl<B>.json
# (perplexity's JSON) and prints a markdown table.
source "$(dirname "$0")/qwen_lib.sh" chai
THREADS=${THREADS:-1}
NICE=${NICE:-10}
BUDGETS=${BUDGETS:-0.02,0.05,0.1,0.2,0.5,100}
T=$SHARED/data/wikitext2/wiki.test.raw
mkdir -p "$OUT"
run() { nice -n "$NICE" "$BIN" "$@"; }
IFS=',' read -r -a BS <<< "$BUDGETS"
if [ ! -f "$OUT/plan-kl${BS[-1]}.json" ]; then
  run calibrate --model "$MODEL" --threads "$THREADS" --text "$T" --samples 64 --max-kl "$BUDGETS" --out "$OUT/plan.json"
fi
for b in "${BS[@]}"; do
  for head in chai chai-static; do
    f=$OUT/$head-kl$b.json
    [ -f "$f" ] && continue
    run perplexity --model "$MODEL" --threads "$THREADS" --text "$T" --max-tokens 1024 --compare-full --json \
      --policy "$head:plan=$OUT/plan-kl$b.json" > "$f.tmp"
    mv "$f.tmp" "$f"
  done
done
python3 - "$OUT" "${BS[@]}" <<'PY'
import json, sys
out, budgets = sys.argv[1], sys.argv[2:]
print("| `--max-kl` | KV heads giving up K (of 56) | K freed | KV MiB allocated (full 56.0) | calibration KL | held-out KL dynamic / static | NLL dynamic / static (full) | top-1 dynamic / static |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for b in budgets:
    q = json.load(open(f"{out}/plan-kl{b}.json"))["quality"]
    d, s = (json.load(open(f"{out}/{h}-kl{b}.json")) for h in ("chai", "chai-static"))
    cd, cs = d["compare_full"], s["compare_full"]
    print(f"| {b} | {q['kv_heads_freed']} | {q['kv_heads_freed'] / 56:.1%} | {d['kv_bytes_allocated'] / 2**20:.1f} | "
          f"{q['measured_kl']:.4f} | {cd['kl_mean']:.4f} / {cs['kl_mean']:.4f} | "
          f"{d['nll']:.4f} / {s['nll']:.4f} ({cd['full_nll']:.4f}) | "
          f"{cd['top1_agreement']:.1%} / {cs['top1_agreement']:.1%} |")
PY
