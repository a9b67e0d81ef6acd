#!/usr/bin/env bash
# Bit-identity check for refactors: runs many policies through `kvslim
# perplexity --per-token --kept-out` (and a few generations) with one binary,
# writing per-token log-probs, kept sets and bytes to OUT; run it with the
# binary of the old and of the new tree, then compare the two folders:
#   BIN=old/target/release/kvslim OUT=/tmp/before bash scripts/refactor_check.sh
#   BIN=target/release/kvslim     OUT=/tmp/after  bash scripts/refactor_check.sh
#   bash scripts/refactor_check.sh compare /tmp/before /tmp/after
# Timing fields and the spec text (it holds the plan path) are ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = compare ]; then
  python3 - "$2" "$3" <<'PY'
import json, os, sys
a_dir, b_dir = sys.argv[1], sys.argv[2]
bad = 0
for f in sorted(os.listdir(a_dir)):
    a, b = open(os.path.join(a_dir, f)).read(), open(os.path.join(b_dir, f)).read()
    if f.startswith("ppl_"):
        ja, jb = json.loads(a), json.loads(b)
        for j in (ja, jb):
            for k in [k for k in j if "ms" in k or k == "policy"]:
                j.pop(k)
        if ja != jb:
            bad += 1
            print("differs:", f, [k for k in ja if ja.get(k) != jb.get(k)])
    elif f != "index.txt" and a != b:
        bad += 1
        print("differs:", f)
print(f"{len(os.listdir(a_dir))} files, {bad} differ")
sys.exit(1 if bad else 0)
PY
  exit
fi
BIN=${BIN:-./target/release/kvslim}
OUT=${OUT:?set OUT to an empty folder}
S=${KVSLIM_SHARED:-../shared}
mkdir -p "$OUT"
T=$S/data/wikitext2/wiki.test.raw
P=$OUT/plan.json
$BIN calibrate --text "$T" --samples 4 --seq-len 64 --restarts 2 --out "$P" > /dev/null 2>&1
i=0
run() {
  i=$((i + 1))
  $BIN perplexity --threads 2 --text "$T" --max-tokens 300 --json --per-token --kept-out "$OUT/kept_$i.json" "$@" \
    > "$OUT/ppl_$i.json" 2> /dev/null || echo "{\"failed\": \"$*\"}" > "$OUT/ppl_$i.json"
  echo "$i $*" >> "$OUT/index.txt"
}
rm -f "$OUT/index.txt"
for pf in 0 120; do
  for policy in full "h2o:heavy=24,recent=24" "h2o:heavy=24,recent=24,page=8,kv_dtype=q8" \
    "h2o:heavy=24,recent=16,page=8,page_score=sum" "sink:sink=4,recent=40,page=16,compact=8" \
    "random:budget=40,recent=20" "heavy:heavy=48" "h2o:heavy=24,recent=24,agg=max" \
    "chai:plan=$P" "full:kv_dtype=f16+chai-static:plan=$P" "h2o:heavy=24,recent=24+chai:plan=$P" \
    "h2o:heavy=24,recent=24,prefill=stream:16"; do
    run --prefill $pf --policy "$policy"
  done
  run --prefill $pf --policy "h2o:heavy=24,recent=24,kv_dtype=q4" --decisions-from f32
done
run --prefill 200 --policy full --compare-full
run -m gemma3-270m --prefill 100 --policy full
run -m gemma3-270m --prefill 100 --policy "h2o:heavy=24,recent=24"
$BIN generate --threads 2 --prompt "The history of the city" --max-tokens 40 --policy "h2o:heavy=16,recent=16" > "$OUT/gen1.txt" 2> /dev/null || true
$BIN generate --threads 2 --prompt "Once upon a time" --max-tokens 40 --beams 3 --policy "h2o:heavy=16,recent=16,page=4" > "$OUT/gen2.txt" 2> /dev/null || true
$BIN generate --threads 2 --prompt "The history of the city" --max-tokens 40 --speculative self --policy "h2o:heavy=16,recent=16" > "$OUT/gen3.txt" 2> /dev/null || true
echo "wrote $OUT ($i perplexity runs, 3 generations)"
