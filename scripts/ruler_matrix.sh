#!/usr/bin/env bash
# The RULER-style long-context suite of SmolLM2 (issue #15): passkey,
# niah_single, niah_multikey, niah_multivalue, vt and cwe at 1,024 / 2,048 /
# 4,096 / 8,000-token prompts (8,000: the model's 8,192 context less the
# answer), the needles at half depth (cwe has none), one item per length,
# under full, window, sink, H2O and H2O with SnapKV prefill at 20% and 10%:
# 54 cells, 9 per task, about an hour. (Three depths per length took
# three times as long, 350 s per cell on one thread, most of it at 8,000
# tokens.) Made locally from the tasks' default seed, no download.
#
# Two shards side by side (1 thread each) from the same pinned binary as the
# whole-set matrix (scripts/whole_matrix.sh), merged at the end:
#
#   bash scripts/ruler_matrix.sh run      both shards → docs/ruler/smollm2-shard-{0,1}
#   bash scripts/ruler_matrix.sh merge    → docs/ruler/merged (tables and plots)
#
# A cut-off run continues with `run` again (`eval --resume`).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/docs/ruler
TREE=${MATRIX_TREE:-$ROOT/../kvslim-matrix}
S=${KVSLIM_SHARED:-$ROOT/../shared}
MODEL=$S/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
AT="lengths=1024,2048,4096,8000,depths=0.5,per_cell=1"
TASKS="passkey:$AT;niah_single:$AT;niah_multikey:$AT;niah_multivalue:$AT;vt:$AT;cwe:$AT"
POLICIES="full;window;sink;h2o;h2o:prefill=snap:32"
BUDGETS=20%,10%

case "${1:-}" in
  run)
    # the pinned build of the whole-set matrix (its worktree, built if missing)
    bash scripts/whole_matrix.sh build
    mkdir -p "$OUT"
    for i in 0 1; do
      RAYON_NUM_THREADS=1 nice "$TREE/target/release/kvslim" eval --model "$MODEL" --threads 1 \
        --policies "$POLICIES" --budgets "$BUDGETS" --tasks "$TASKS" \
        --shard "$i/2" --resume --out "$OUT/smollm2-shard-$i" > "$OUT/shard-$i.log" 2>&1 &
    done
    wait
    ;;
  merge)
    rm -rf "$OUT/merged"
    "$TREE/target/release/kvslim" eval merge --out "$OUT/merged" "$OUT"/smollm2-shard-0 "$OUT"/smollm2-shard-1
    ;;
  *)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
