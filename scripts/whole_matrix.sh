#!/usr/bin/env bash
# The whole-set evaluation matrix of SmolLM2 (every item of the six
# zero-shot tasks and 64 WikiText-2 windows of 512, `full` plus five
# policies × 40/20/10/5%: 147 cells, ~25 hours on 2 cores), run shard by
# shard across sessions and machines and merged at the end.
#
# Every shard runs the binary of one pinned commit (MATRIX_COMMIT), built
# in its own worktree: a shard's fingerprint (shard.json) includes the
# commit, so shards of different builds are never merged into one table.
# 21 shards; shard I owns cell I of every task: 0 = full, 1–4 window,
# 5–8 sink, 9–12 heavy, 13–16 random, 17–20 h2o, each at 40/20/10/5%.
# Results go to docs/whole/smollm2-whole-shard-I/ (committed as they grow).
# A run cut off midway loses nothing but its current block of 16 items:
# `eval --resume` continues the cell from partial.jsonl.
#
#   bash scripts/whole_matrix.sh build         the pinned binary only (also used by ruler_matrix.sh)
#   bash scripts/whole_matrix.sh run I [J …]   shards in parallel, 1 thread each
#   bash scripts/whole_matrix.sh continue      every unfinished shard, LANES=2 at a time
#   bash scripts/whole_matrix.sh pack          gzip partial.jsonl files to commit them
#   bash scripts/whole_matrix.sh status        finished cells per shard
#   bash scripts/whole_matrix.sh peek          finished cells so far → docs/whole/partial
#   bash scripts/whole_matrix.sh merge         all 21 shards → docs/whole/merged
set -euo pipefail
cd "$(dirname "$0")/.."
MATRIX_COMMIT=${MATRIX_COMMIT:-92581f9b666b02235bd1af2c1d5f606d0aaec584}
SHARDS=21
ROOT=$PWD
OUT=$ROOT/docs/whole
TREE=${MATRIX_TREE:-$ROOT/../kvslim-matrix}

CELLS=7 # cells per shard: one per task

# finished cells of shard directory $1 (a resumed cell's repeated row counts twice)
finished() { grep -c . "$1/results.jsonl" 2>/dev/null || true; }

build() {
  if [ ! -d "$TREE" ]; then
    git worktree add --detach "$TREE" "$MATRIX_COMMIT"
  fi
  [ "$(git -C "$TREE" rev-parse HEAD)" = "$MATRIX_COMMIT" ] || {
    echo "error: $TREE is not at $MATRIX_COMMIT" >&2
    exit 1
  }
  (cd "$TREE" && cargo build --release -q -p kvslim)
}

case "${1:-}" in
  build)
    build
    ;;
  run)
    shift
    [ $# -gt 0 ] || { echo "usage: $0 run I [J …] (0 <= I < $SHARDS)" >&2; exit 2; }
    build
    mkdir -p "$OUT"
    for i in "$@"; do
      [ "$i" -ge 0 ] && [ "$i" -lt $SHARDS ] || { echo "error: shard $i not in 0..$((SHARDS - 1))" >&2; exit 2; }
      d="$OUT/smollm2-whole-shard-$i"
      [ -f "$d/partial.jsonl.gz" ] && gunzip -f "$d/partial.jsonl.gz"
      (cd "$TREE" && RAYON_NUM_THREADS=1 WHOLE=1 SHARD="$i/$SHARDS" nice bash scripts/reproduce.sh "$OUT" \
        > "$OUT/shard-$i.log" 2>&1) &
    done
    wait
    ;;
  continue)
    # unfinished shards, H2O first; lane k runs every LANES-th of them in turn
    lanes=${LANES:-2}
    todo=()
    for i in 0 17 18 19 20 $(seq 1 16); do
      n=$(finished "$OUT/smollm2-whole-shard-$i")
      [ "${n:-0}" -ge $CELLS ] || todo+=("$i")
    done
    echo "unfinished shards: ${todo[*]:-none}"
    build
    for lane in $(seq 0 $((lanes - 1))); do
      (
        for k in "${!todo[@]}"; do
          [ $((k % lanes)) -eq "$lane" ] && bash "$ROOT/scripts/whole_matrix.sh" run "${todo[$k]}"
        done
      ) &
    done
    wait
    ;;
  pack)
    for f in "$OUT"/smollm2-whole-shard-*/partial.jsonl; do
      [ -s "$f" ] && gzip -9f "$f"
    done
    true
    ;;
  status)
    for d in "$OUT"/smollm2-whole-shard-*; do
      [ -d "$d" ] || continue
      n=$(finished "$d")
      p=$( (zcat -f "$d/partial.jsonl.gz" 2>/dev/null || cat "$d/partial.jsonl" 2>/dev/null) | grep -o '"start":[0-9]*' | tail -1 || true)
      echo "$(basename "$d"): ${n:-0} of $CELLS cells${p:+, cell in flight past item ${p#*:}}"
    done
    ;;
  peek)
    # this checkout's binary: `merge --partial` only renders finished rows
    cargo build --release -q -p kvslim
    dirs=()
    for d in "$OUT"/smollm2-whole-shard-*; do [ -f "$d/results.jsonl" ] && dirs+=("$d"); done
    rm -rf "$OUT/partial"
    ./target/release/kvslim eval merge --partial --no-charts --out "$OUT/partial" "${dirs[@]}"
    ;;
  merge)
    build
    dirs=()
    for i in $(seq 0 $((SHARDS - 1))); do dirs+=("$OUT/smollm2-whole-shard-$i"); done
    "$TREE/target/release/kvslim" eval merge --out "$OUT/merged" "${dirs[@]}"
    ;;
  *)
    sed -n '2,22p' "$0" >&2
    exit 2
    ;;
esac
