#!/usr/bin/env bash
# The fidelity matrix on Qwen2.5-Coder-1.5B (issue #34), run in groups of
# policy families across sessions, two lanes (shards) of one thread each,
# every cell from the binary of one pinned commit (QWEN_MATRIX_COMMIT)
# built in its own worktree; a shard's fingerprint (shard.json) includes
# the commit, so shards of different builds are never merged together.
#
# Group r4k-a: the RULER-style suite (passkey, niah single/multikey/
#   multivalue, vt, cwe) at 4,096-token prompts, needles at half depth, two
#   items per task (12 per cell); full + window, sink, H2O, SnapKV
#   (`h2o:prefill=snap:32`) at kept shares 50 / 25 / 12.5% (kvpress
#   compression ratios 0.5 / 0.75 / 0.875): 13 cells, ~100 s per item on
#   one thread.
# Group r4k-b: the same items under TOVA, H2O with normalised sums
#   (`score=norm`), value-norm scores (`score=vnorm`), PyramidKV
#   (`alloc=pyramid:0.5`) and AdaKV (`alloc=ada:0.2`): 15 cells.
#
#   bash scripts/qwen_matrix.sh build            the pinned binary only
#   bash scripts/qwen_matrix.sh run GROUP        both shards of GROUP (resumes a cut-off run)
#   bash scripts/qwen_matrix.sh status           finished cells per group and shard
#   bash scripts/qwen_matrix.sh merge GROUP      → docs/qwen/GROUP/merged (tables, plots)
#
# Results go to docs/qwen/GROUP/shard-{0,1} (commit them as they grow).
set -euo pipefail
cd "$(dirname "$0")/.."
QWEN_MATRIX_COMMIT=${QWEN_MATRIX_COMMIT:-7035e4e7da12591bd7cc79fd93c220ee7991b169}
ROOT=$PWD
OUT=$ROOT/docs/qwen
TREE=${QWEN_MATRIX_TREE:-$ROOT/../kvslim-qwen-matrix}
BIN=$TREE/bin/kvslim
MODEL=qwen2.5-coder-1.5b
AT4K="lengths=4096,depths=0.5,per_cell=2"
RULER4K="passkey:$AT4K;niah_single:$AT4K;niah_multikey:$AT4K;niah_multivalue:$AT4K;vt:$AT4K;cwe:$AT4K"
BUDGETS=50%,25%,12.5%

group() {
  case "$1" in
    r4k-a) POLICIES="full;h2o;h2o:prefill=snap:32;window;sink" TASKS=$RULER4K ;;
    r4k-b) POLICIES="h2o:agg=max,score=tova;h2o:score=norm;h2o:score=vnorm;h2o:alloc=pyramid:0.5;h2o:alloc=ada:0.2"
           TASKS=$RULER4K ;;
    *) echo "error: unknown group \`$1\` (r4k-a, r4k-b)" >&2; exit 2 ;;
  esac
}

build() {
  if [ ! -d "$TREE" ]; then
    git worktree add --detach "$TREE" "$QWEN_MATRIX_COMMIT"
  fi
  [ "$(git -C "$TREE" rev-parse HEAD)" = "$(git rev-parse "$QWEN_MATRIX_COMMIT")" ] || {
    echo "error: $TREE is not at $QWEN_MATRIX_COMMIT" >&2
    exit 1
  }
  if [ ! -x "$BIN" ]; then
    # the main checkout's target folder: its dependencies are already built
    (cd "$TREE" && CARGO_TARGET_DIR="$ROOT/target" cargo build --release -q -p kvslim)
    mkdir -p "$TREE/bin"
    cp "$ROOT/target/release/kvslim" "$BIN"
    # the next build of the main checkout replaces target/release/kvslim again
    touch "$ROOT/crates/cli/src/main.rs"
  fi
}

case "${1:-}" in
  build)
    build
    ;;
  run)
    group "${2:-}"
    build
    "$BIN" fetch "$MODEL" > /dev/null
    mkdir -p "$OUT/$2"
    for i in 0 1; do
      RAYON_NUM_THREADS=1 nice -n 19 "$BIN" eval --model "$MODEL" --threads 1 \
        --policies "$POLICIES" --budgets "$BUDGETS" --tasks "$TASKS" \
        --shard "$i/2" --resume --out "$OUT/$2/shard-$i" > "$OUT/$2/shard-$i.log" 2>&1 &
    done
    wait
    ;;
  status)
    for d in "$OUT"/*/shard-*; do
      [ -d "$d" ] && echo "$d: $(grep -c . "$d/results.jsonl" 2>/dev/null || echo 0) cells"
    done
    ;;
  merge)
    group "${2:-}"
    rm -rf "$OUT/$2/merged"
    "$BIN" eval merge --out "$OUT/$2/merged" "$OUT/$2/shard-0" "$OUT/$2/shard-1"
    ;;
  *)
    sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
