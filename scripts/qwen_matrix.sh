#!/usr/bin/env bash
# The fidelity matrix on Qwen2.5-Coder-1.5B (issue #34), run in groups of
# policy families across sessions, in lanes (shards), every cell of a group from the binary of the group's pinned commit built
# in its own worktree; a shard's fingerprint (shard.json) includes the
# commit, so shards of different builds are never merged together.
#
# Group r4k: the RULER-style suite (passkey, niah single/multikey/
#   multivalue, vt, cwe) and compress-once-ask-many (niah_multiquery: four
#   questions per context) at 4,096-token prompts, needles at half depth,
#   two items per task; full + window, sink, H2O, SnapKV, TOVA, H2O with
#   normalised sums, value-norm scores, PyramidKV, AdaKV and Expected
#   Attention at kept shares 75 / 50 / 25 / 12.5% (kvpress compression
#   ratios 0.25 / 0.5 / 0.75 / 0.875): 41 cells per task, 287 in all. Each
#   shard runs a task's cells item by item with one shared prefill per
#   prompt (docs/evaluation.md, "One prefill per prompt").
#   Supersedes r4k-a and r4k-b (run cell by cell at 7035e4e, kept for
#   comparison).
# Group r4k-z: the r4k items under the KVzip-style (`prefill=kvzip`) and
#   ADAPTIVE_RKV-style (`prefill=rkv`) prefills, with the full cache again
#   for the paired intervals: 9 cells per task, 63 in all; per item and lane
#   one repeat prefill (the prompt twice) shared by the four kvzip budgets
#   and one tiled prefill shared by full and rkv.
# Group r4k-auto: the r4k items under `auto` (docs/qwen.md, "auto on
#   Qwen2.5-Coder-1.5B"; pinned where its Qwen row became value-norm scores,
#   4 sinks and SnapKV's prefill) beside paper H2O, SnapKV and the full
#   cache, at the four kept shares: 13 cells per task, 91 in all.
# Group r4k-a: the RULER-style suite (passkey, niah single/multikey/
#   multivalue, vt, cwe) at 4,096-token prompts, needles at half depth, two
#   items per task (12 per cell); full + window, sink, H2O, SnapKV
#   (`h2o:prefill=snap:32`) at kept shares 50 / 25 / 12.5% (kvpress
#   compression ratios 0.5 / 0.75 / 0.875): 13 cells, ~100 s per item on
#   one thread.
# Group r4k-b: the same items under TOVA, H2O with normalised sums
#   (`score=norm`), value-norm scores (`score=vnorm`), PyramidKV
#   (`alloc=pyramid:0.5`) and AdaKV (`alloc=ada:0.2`): 15 cells.
# Group lcc-a: LCC-style code completion (../shared/data/code_completion,
#   the 39 items of ~2K tokens: `max_context=2600`), first line scored by
#   exact match and edit similarity; full, H2O, SnapKV, window, sink, TOVA
#   and `auto` at 75 / 50 / 25 / 12.5% kept: 25 cells, one shared prefill
#   per item and lane (pinned at r4k-auto's commit, which has `auto`).
#
# Group q05-r4k (issue #49, on Qwen2.5-Coder-0.5B, a third of the 1.5B's
#   cost; superseded by q05-ruler after 1.2 of its 13 tasks, journals kept): the RULER-style needle tasks at 4,096 tokens with 50 items each
#   (depths 0.1/0.3/0.5/0.7/0.9, ten items per depth), every needle task in
#   both haystacks (repeated noise sentences and real WikiText-2 text,
#   `haystack=text`) plus cwe: 13 tasks, 650 items; full, window, sink,
#   H2O, TOVA, SnapKV, Expected Attention and `auto` at 50 / 25 / 12.5%
#   kept: 22 cells per task, 286 in all. Estimated before starting: about
#   100 s per item and lane on one thread (three shared prefills: tiled,
#   TOVA's query by query and Expected Attention's, and ~450 decode steps,
#   at a third of the 1.5B's cost), so about 9 hours per lane over several
#   sessions (`run` resumes); the journals record the measured seconds. KVzip-style cells join once its probe is faithful
#   (issue #50).
# Group q05-zap (issue #50, on Qwen2.5-Coder-0.5B): the q05-r4k items under
#   the KVzap-style prefill against the KVzip-style probe it learns, both
#   as `auto` runs them for a context (`recent_share=0.125`, `alloc=global`;
#   the probe in pieces, the refitted predictor), with the full cache again
#   for the paired intervals: 7 cells per task, 91 in all. Estimated before
#   starting: per item and lane one tiled prefill (full), one KVzap prefill
#   and one probe (~2.5 prefills), about 80 s on one thread, so about 7
#   hours per lane; run it after q05-r4k.
# Group q05-ruler (issues #49 and #50, on Qwen2.5-Coder-0.5B): q05-r4k's
#   items and cells from a build whose cells cost less (TOVA from the
#   tiled prefill, sum/norm/vnorm from one column pass, every cell's
#   decode steps and every compress-once question in lockstep: one pass
#   over the weights per step for all, bit-identical to each alone) plus
#   the KVzap-style prefill as `auto` runs it for a context, which shares
#   the tiled prefill: 25 cells per task, 325 in all. Measured before
#   starting, one lane of one item with the other lane paused: 62 s for
#   niah_multiquery (245 s at q05-r4k's commit, the same answers); the
#   tiled prefill is ~25 s of every item. About 45 s per item and lane,
#   so about 8 hours per lane. The KVzip-style cells (its probe costs ~55 s
#   more per item and lane) are left to their own group.
#   Closed after its first three tasks (passkey in both haystacks,
#   niah_single on noise): two one-thread lanes shard by cell, so each lane
#   paid every item's prefill. One lane of two threads pays it once for
#   all 25 cells: measured with the matrix paused, two passkey items of
#   q05-ruler's 25 cells took 48 s that way against 87 s as two one-thread
#   lanes side by side, the same results cell for cell (every kernel
#   splits its work by output rows, so the thread count changes no sum).
# Group q05-ruler-b: q05-ruler's other ten tasks, same build and cells, in
#   one lane of two threads (about 23 s per item); closed after the first
#   (niah_single on real text), when the KVzip-style cells could join
#   the other cells' prefill (below).
# Then one lane of two threads each, pinned at 22ec012: the same outputs
#   as q05-ruler's build (every cell of five items of five tasks the
#   same), the 25 cells 12% faster (the attention output from a
#   column-summing policy's pass; Expected Attention's sums side by side),
#   and the tiled cells inside the KVzip-style cell's run (the prompt and
#   its repeat; every product is integer on these GGUF models, so the
#   prompt's rows are the same beside the repeat's): full, KVzap and
#   KVzip cells of two items 25% faster than apart. The groups queued
#   after q05-ruler-c are pinned at 7c54789, where a column-summing
#   tiled pass also gives a KVzip run's prompt rows their output: the 28
#   cells of two items 9% faster, the same results.
#   q05-ruler-c the other nine tasks, q05-ruler's cells plus the
#             KVzip-style cells as `auto` runs them for a context: 28
#             cells per task, ~45 s per item, ~5.5 hours.
#   q05-zip   the KVzip-style cells for q05-ruler's four finished tasks,
#             paired with their full and KVzap cells by task and item:
#             ~35 s per item, ~2 hours.
#   q05-lcc   all 117 LCC items (~2K, ~4K and ~8K tokens), q05-ruler-c's
#             cells: about 1.5 hours.
#   q05-r8k   the same tasks at 8,192 tokens, ten items per task: about
#             4 hours.
#   q15-ruler q05-ruler-c's cells and tasks on Qwen2.5-Coder-1.5B (~3x the
#             0.5B per item): about 20 hours.
#   q05-zap2  the KVzap-style cells of all 13 tasks with the committed
#             predictor (calibrated on prose and code): q05-ruler's ran the
#             first one (WikiText-2 alone). Paired with their full and
#             KVzip-style cells by task and item. Estimated before
#             starting: the tiled prefill (~13 s on two threads) and three
#             cells' decode steps per item, about 3 hours; measured 4.0 s
#             per item for its three cells (passkey on real text, the
#             machine to itself), so about an hour.
#   q05-cwe   cwe with 50 items (cwe has no depths, so RULER4K50's cwe holds
#             ten): q05-ruler-c's cells and the committed KVzap predictor's,
#             ~45 s per item, ~40 minutes; its first ten items are the ten
#             of q05-ruler-c's cwe, so its cells check the pins' claim of
#             the same outputs.
#   q15-cwe   the same on the 1.5B, ~2 hours.
#   q15-ruler-b q15-ruler's eleven other tasks with cwe's 50 items (q15-cwe's),
#             and KVzap with its floor (q05-zapf's policy) beside the others: it
#             shares the tiled prefill, so it costs three cells' decode steps per
#             item, where a group of its own would pay a 1.5B prefill per item
#             again. Its passkey cells measured 47 s per item (the machine to
#             itself), so about 7.5 hours. Pinned at PIN_ROWS, the first commit
#             with `global:F`; the 1.5B's auto rows are the same there as at
#             PIN_V2.
#   q05-lcc and q05-r8k (not started) were re-pinned on 2026-12-07 at PIN_ROWS, with the 0.5B's
#   auto rows, then at PIN_FLOOR; q05-r8k (its niah_multiquery runs the context rows) at PIN_CONTEXTS.
#   q05-zap2, q05-cwe, q15-ruler and q15-cwe are pinned at 7c54789 with
#   the committed predictors (v2) in calib/kvzap/: the same code as
#   q05-zip's pin, so every cell but the KVzap-style ones is that build's
#   (its commit merged into main's history, its tree not).
#   q05-auto  `auto` alone on the 0.5B's tasks that decide, at the commit whose
#             auto table has the 0.5B's rows (made from the groups above): each
#             row names its winner's budget family, so its cells must equal that
#             family's item by item (qwen/results.md, "`auto` as its rows");
#             one policy, like q05-zap2's 39 cells (86 minutes), ~1.5 hours.
#   q05-auto2 q05-auto's tasks at PIN_FLOOR, the rows with the floor: 39 cells, about
#             ten minutes per task (its log's progress lines, three cells sharing
#             each prefill); its niah_multiquery cells ran the context rows of
#             then (KVzap without the floor, from ten contexts).
#   q05-auto3 niah_multiquery in both haystacks again at PIN_CONTEXTS, where the
#             0.5B's context rows come from the rankings' 50-context cells: 6
#             cells; in q05-auto2 the text task alone took about 26 minutes
#             beside a CI run, so about 40 minutes.
#   q05-zapf  KVzap-style with a floor under its global ranking (`alloc=global:0.1`:
#             every layer and head keeps its top tenth of the uniform share first;
#             on ten niah_multiquery items it answered all on noise at 12.5%
#             where the committed rows answered 7, and as many on real text,
#             docs/contexts.md), the 0.5B's tasks that decide, ~1.5 hours. Not
#             a candidate of the rankings (scripts/qwen_tables.py DECIDE) until
#             all its cells are in: a candidate short of 50 items withholds the
#             model's auto rows.
#
#   bash scripts/qwen_matrix.sh build GROUP      the group's pinned binary only
#   bash scripts/qwen_matrix.sh run GROUP        the lanes of GROUP (resumes a cut-off run)
#   bash scripts/qwen_matrix.sh queue GROUP...   run each group in turn (the next starts when one ends)
#   bash scripts/qwen_matrix.sh status           finished cells per group and shard
#   bash scripts/qwen_matrix.sh merge GROUP      → docs/qwen/GROUP/merged (tables, plots)
#   bash scripts/qwen_matrix.sh record [MESSAGE] commit the journals, then the tables made from the committed ones
#
# Results go to docs/qwen/GROUP/shard-I, one per lane (commit them as they grow).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/docs/qwen
S=${KVSLIM_SHARED:-$ROOT/../shared}
MODEL=qwen2.5-coder-1.5b
AT4K="lengths=4096,depths=0.5,per_cell=2"
RULER4K="passkey:$AT4K;niah_single:$AT4K;niah_multikey:$AT4K;niah_multivalue:$AT4K;vt:$AT4K;cwe:$AT4K"
# every needle task in both haystacks (noise, then text), then cwe, at OPTIONS
both_haystacks() {
  local t out=""
  for t in passkey niah_single niah_multikey niah_multivalue vt niah_multiquery; do
    out="$out$t:$1;$t:haystack=text,$1;"
  done
  echo "${out}cwe:$1"
}
# 50 items per task; at 8K ten (two per depth)
RULER4K50=$(both_haystacks "lengths=4096,depths=0.1,0.3,0.5,0.7,0.9,per_cell=10")
RULER8K=$(both_haystacks "lengths=8192,depths=0.1,0.3,0.5,0.7,0.9,per_cell=2")
# cwe has no depths: RULER4K50's cwe holds ten items, this one 50 (its first ten the same)
CWE50="cwe:lengths=4096,per_cell=50"
# the tasks that decide: RULER4K50 with CWE50 for its cwe
DECIDE4K="${RULER4K50%;cwe:*};$CWE50"
BUDGETS=50%,25%,12.5%
# lanes (shards by cell) per group and threads per lane; a group whose cells
# share one prefill per item runs in one lane of two threads, which pays it
# once (the thread count changes no result)
LANES=2
THREADS=1
# set for a group that will not run again, saying why
CLOSED=

# the binary of commit $1, built once in its own worktree
pin() {
  COMMIT=$1
  TREE=${QWEN_MATRIX_TREE:-$ROOT/../kvslim-qwen-matrix}-${COMMIT:0:7}
  BIN=$TREE/bin/kvslim
}

# 7c54789 with the predictors calibrated on prose and code (calib/kvzap/)
PIN_V2=c41f3520760ca6b57aeb8acac01a40cb14ae44b8
# the 0.5B's auto rows (6990f73) and alloc=global:F: groups not started by 2026-12-07 run here, so
# their `auto` cells are the rows of auto's table and not the pinned default rows
PIN_ROWS=ef98df515ad35a46e704998ab9182830a0a479bb
# the 0.5B's rows from q05-zapf (KVzap with the floor, alloc=global:0.1): auto's groups after it
PIN_FLOOR=e2f71646e3ef569e80ec8cebb790782c3e94762e
# the 0.5B's context rows from its rankings' niah_multiquery cells (the floor at 25 and 12.5%)
PIN_CONTEXTS=08ebaff04d3c202367c9580a48244a9a908b2687

group() {
  Q05="full;window;sink;h2o;h2o:agg=max,score=tova;h2o:prefill=snap:32;h2o:prefill=expect;auto;h2o:recent_share=0.125,prefill=kvzap,alloc=global"
  ZIP="h2o:recent_share=0.125,prefill=kvzip,alloc=global"
  ZAPF="h2o:recent_share=0.125,prefill=kvzap,alloc=global:0.1"
  A="full;h2o;h2o:prefill=snap:32;window;sink"
  B="h2o:agg=max,score=tova;h2o:score=norm;h2o:score=vnorm;h2o:alloc=pyramid:0.5;h2o:alloc=ada:0.2"
  case "$1" in
    r4k) POLICIES="$A;$B;h2o:prefill=expect" TASKS="$RULER4K;niah_multiquery:$AT4K" BUDGETS=75%,50%,25%,12.5%
         pin 1930b9e5de4805185eeefa53338ab43626d26a1d ;;
    r4k-z) POLICIES="full;h2o:prefill=kvzip;h2o:prefill=rkv" TASKS="$RULER4K;niah_multiquery:$AT4K" BUDGETS=75%,50%,25%,12.5%
           pin d1661aa5416a327ae8e3d4e58a762d4ce6de6df8 ;;
    r4k-auto) POLICIES="full;auto;h2o;h2o:prefill=snap:32" TASKS="$RULER4K;niah_multiquery:$AT4K" BUDGETS=75%,50%,25%,12.5%
              pin c0e6770df28b0a71c35071cf00ddea5eab012ce6 ;;
    r4k-a) POLICIES=$A TASKS=$RULER4K; pin 7035e4e7da12591bd7cc79fd93c220ee7991b169 ;;
    r4k-b) POLICIES=$B TASKS=$RULER4K; pin 7035e4e7da12591bd7cc79fd93c220ee7991b169 ;;
    lcc-a) POLICIES="$A;h2o:agg=max,score=tova;auto" TASKS="lcc:$S/data/code_completion/stdlib_lcc.jsonl,max_context=2600"
           BUDGETS=75%,50%,25%,12.5%
           pin c0e6770df28b0a71c35071cf00ddea5eab012ce6 ;;
    q05-r4k) MODEL=qwen2.5-coder-0.5b
             POLICIES="full;window;sink;h2o;h2o:agg=max,score=tova;h2o:prefill=snap:32;h2o:prefill=expect;auto"
             TASKS=$RULER4K50
             CLOSED="superseded by q05-ruler after 1.2 of its 13 tasks"
             pin 4065e2ee3eb915e04048118f591f7cbffd324680 ;;
    q05-zap) MODEL=qwen2.5-coder-0.5b
             POLICIES="full;h2o:recent_share=0.125,prefill=kvzap,alloc=global;h2o:recent_share=0.125,prefill=kvzip,alloc=global"
             TASKS=$RULER4K50
             CLOSED="replaced by q05-ruler's KVzap cells and q05-zip before it started"
             pin d03327432c861d957cfdbd867e10bdff37854ec1 ;;
    q05-ruler) MODEL=qwen2.5-coder-0.5b
             POLICIES=$Q05
             TASKS=$RULER4K50
             CLOSED="closed after its first three tasks; the other ten run as q05-ruler-b"
             pin ad487289f741f4399f40b4bb6e464ab9fa5b076c ;;
    q05-ruler-b) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2
             POLICIES=$Q05
             TASKS=$(echo "$RULER4K50" | cut -d';' -f4-)
             CLOSED="closed after its first task; the other nine run with the KVzip-style cells as q05-ruler-c"
             pin ad487289f741f4399f40b4bb6e464ab9fa5b076c ;;
    q05-ruler-c) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2
             POLICIES="$Q05;$ZIP"
             TASKS=$(echo "$RULER4K50" | cut -d';' -f5-)
             pin 22ec0120576603d5bc4cfd804878269e71f6372f ;;
    q05-zip) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2
             POLICIES=$ZIP
             TASKS=$(echo "$RULER4K50" | cut -d';' -f1-4)
             pin 7c547895ce9e8e9cbab4f88b230fefb97830a9f2 ;;
    q05-lcc) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2
             POLICIES="$Q05;$ZIP"
             TASKS="lcc:$S/data/code_completion/stdlib_lcc.jsonl"
             pin $PIN_FLOOR ;;
    q05-r8k) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2
             POLICIES="$Q05;$ZIP"
             TASKS=$RULER8K
             pin $PIN_CONTEXTS ;;
    q05-zap2) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2
             POLICIES="h2o:recent_share=0.125,prefill=kvzap,alloc=global"
             TASKS=$RULER4K50
             pin $PIN_V2 ;;
    q15-ruler) LANES=1 THREADS=2 POLICIES="$Q05;$ZIP"
             TASKS=$RULER4K50
             CLOSED="closed after its first two tasks (passkey in both haystacks); the rest run with KVzap's floor as q15-ruler-b"
             pin $PIN_V2 ;;
    q15-ruler-b) LANES=1 THREADS=2 POLICIES="$Q05;$ZIP;$ZAPF"
             TASKS=$(echo "$DECIDE4K" | cut -d';' -f3-)
             pin $PIN_ROWS ;;
    q05-cwe) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2
             POLICIES="$Q05;$ZIP"
             TASKS=$CWE50
             pin $PIN_V2 ;;
    q15-cwe) LANES=1 THREADS=2 POLICIES="$Q05;$ZIP"
             TASKS=$CWE50
             CLOSED="not started: its 50 cwe items run in q15-ruler-b"
             pin $PIN_V2 ;;
    q05-zapf) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2
             POLICIES=$ZAPF
             TASKS=$DECIDE4K
             pin $PIN_ROWS ;;
    q05-auto) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2 POLICIES="auto"
             TASKS=$DECIDE4K
             CLOSED="closed after 30 of its 39 cells: q05-zapf's floor replaced the rows it ran; q05-auto2 runs the new ones"
             pin 6990f73204dfcc946a8cddc11c5b516cbbe1f7e5 ;;
    q05-auto2) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2 POLICIES="auto"
             TASKS=$DECIDE4K
             pin $PIN_FLOOR ;;
    q05-auto3) MODEL=qwen2.5-coder-0.5b LANES=1 THREADS=2 POLICIES="auto"
             TASKS=$(echo "$DECIDE4K" | tr ';' '\n' | grep '^niah_multiquery:' | paste -sd';')
             pin $PIN_CONTEXTS ;;
    *) echo "error: unknown group \`$1\` (r4k, r4k-z, r4k-auto, r4k-a, r4k-b, lcc-a, q05-r4k, q05-zap, q05-ruler, q05-ruler-b, q05-ruler-c, q05-zip, q05-zap2, q05-cwe, q05-auto, q05-auto2, q05-auto3, q05-zapf, q05-lcc, q05-r8k, q15-ruler, q15-ruler-b, q15-cwe)" >&2; exit 2 ;;
  esac
}

build() {
  if [ ! -d "$TREE" ]; then
    git worktree add --detach "$TREE" "$COMMIT"
  fi
  [ "$(git -C "$TREE" rev-parse HEAD)" = "$(git rev-parse "$COMMIT")" ] || {
    echo "error: $TREE is not at $COMMIT" >&2
    exit 1
  }
  if [ ! -x "$BIN" ]; then
    # the main checkout's target folder: its dependencies are already built
    (cd "$TREE" && CARGO_TARGET_DIR="$ROOT/target" cargo build --release -q -p kvslim)
    mkdir -p "$TREE/bin"
    cp "$ROOT/target/release/kvslim" "$BIN"
    # cargo does not hash a workspace member's path: the worktree's crates
    # now look fresh to the main checkout's builds, so its sources must be
    # newer than them for its next build to recompile every crate
    find "$ROOT/crates" "$ROOT/testing" -name '*.rs' -exec touch {} +
  fi
}

case "${1:-}" in
  build)
    group "${2:-}"
    build
    ;;
  run)
    group "${2:-}"
    if [ -n "$CLOSED" ]; then
      echo "$2: $CLOSED"
      exit 0
    fi
    build
    "$BIN" fetch "$MODEL" > /dev/null
    mkdir -p "$OUT/$2"
    for i in $(seq 0 $((LANES - 1))); do
      # appended, so a resumed run keeps the earlier runs' timings
      echo "== run started $(date -u +%FT%TZ)" >> "$OUT/$2/shard-$i.log"
      # from inside the pinned tree: results record the commit `git rev-parse` finds there
      (cd "$TREE" && RAYON_NUM_THREADS=$THREADS nice -n 19 "$BIN" eval --model "$MODEL" --threads "$THREADS" \
        --policies "$POLICIES" --budgets "$BUDGETS" --tasks "$TASKS" \
        --shard "$i/$LANES" --resume --out "$OUT/$2/shard-$i" >> "$OUT/$2/shard-$i.log" 2>&1) &
    done
    wait
    ;;
  queue)
    shift
    for g in "$@"; do
      group "$g"  # every name checked before the first starts
    done
    for g in "$@"; do
      bash "$0" run "$g"
    done
    ;;
  status)
    for d in "$OUT"/*/shard-*; do
      [ -d "$d" ] && echo "$d: $(grep -c . "$d/results.jsonl" 2>/dev/null || echo 0) cells"
    done
    ;;
  record)
    # commit the journals as they stand, then the tables made from exactly the committed
    # journals (a lane appends rows while this runs: tables made from the working tree could
    # hold a row the commit lacks, and scripts/check_docs.py would fail on a clean checkout)
    git add "$OUT"
    MESSAGE=${2:-"matrix journals"}
    git commit -q -m "$MESSAGE" -- "$OUT" || true
    SNAP=$(mktemp -d)
    git archive HEAD | tar -x -C "$SNAP"
    python3 scripts/qwen_tables.py --write --results "$SNAP"
    rm -rf "$SNAP"
    git commit -q -m "tables regenerated from the committed journals" -- README.md docs/qwen/results.md || true
    git log --oneline -2
    ;;
  merge)
    group "${2:-}"
    rm -rf "$OUT/$2/merged"
    "$BIN" eval merge --out "$OUT/$2/merged" $(for i in $(seq 0 $((LANES - 1))); do echo "$OUT/$2/shard-$i"; done)
    ;;
  *)
    sed -n '2,/^# Results go/p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
