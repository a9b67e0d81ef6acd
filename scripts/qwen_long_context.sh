#!/usr/bin/env bash
# Long prompts on Qwen2.5-Coder-1.5B (issue #33, item 3): for each prompt
# length and policy, one `kvslim generate` of GEN greedy tokens after a
# WikiText-2 prompt of about that many tokens (the whole prompt one prefill
# chunk), with the process's peak resident memory, so that the tables say
# what a 16K prompt costs in time, KV bytes and RAM.
#
#   bash scripts/qwen_long_context.sh                 # 8K and 16K, three policies
#   LENGTHS=32768 bash scripts/qwen_long_context.sh   # 32K, the same three
#
# Writes docs/qwen/long/<length>-<n>.json (generate's JSON without the ids
# and text, plus `target_len` and `peak_rss_mib`; n is the policy's index in
# POLICIES) and prints a markdown table of every file there. A run whose
# file exists is skipped: delete the file to measure it again.
source "$(dirname "$0")/qwen_lib.sh" long
LENGTHS=${LENGTHS:-8192,16384}
GEN=${GEN:-16}
THREADS=${THREADS:-2}
# characters of WikiText-2 per Qwen token (measured: 4.37 over the first 31,539
# characters, 4.00 over the first 71,270; the tables report the real count)
CHARS_PER_TOKEN=${CHARS_PER_TOKEN:-4.0}
POLICIES=${POLICIES:-full;h2o:heavy=5%,recent=5%;h2o:heavy=5%,recent=5%,prefill=snap:32}
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time missing (apt-get install time)" >&2; exit 1; }
TEXT=$SHARED/data/wikitext2/wiki.test.raw
[ -f "$TEXT" ] || { echo "error: $TEXT missing" >&2; exit 1; }
mkdir -p "$OUT"
IFS=';' read -r -a POLS <<< "$POLICIES"
IFS=',' read -r -a LENS <<< "$LENGTHS"
for len in "${LENS[@]}"; do
  python3 -c "import sys; t=open(sys.argv[1]).read(); print(t[:int(int(sys.argv[2]) * float(sys.argv[3]))], end='')" \
    "$TEXT" "$len" "$CHARS_PER_TOKEN" > "$OUT/prompt.txt"
  for i in "${!POLS[@]}"; do
    p=${POLS[$i]}
    if [ -f "$OUT/$len-$i.json" ]; then
      echo "== about $len tokens, $p: $OUT/$len-$i.json exists, skipped" >&2
      continue
    fi
    echo "== about $len tokens, $p" >&2
    /usr/bin/time -v "$BIN" generate --model "$MODEL" --threads "$THREADS" --prompt-file "$OUT/prompt.txt" \
      --max-tokens "$GEN" --temperature 0 --policy "$p" --json > "$OUT/raw.json" 2> "$OUT/time.txt"
    python3 - "$OUT" "$len" "$i" <<'PY'
import json, re, sys
out, length, i = sys.argv[1], int(sys.argv[2]), sys.argv[3]
row = json.load(open(f"{out}/raw.json"))
for k in ("text", "token_ids", "prompt_token_ids"):
    row.pop(k, None)
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{out}/time.txt").read()).group(1))
row.update(target_len=length, peak_rss_mib=round(rss / 1024, 1))
json.dump(row, open(f"{out}/{length}-{i}.json", "w"), indent=1)
PY
  done
done
rm -f "$OUT/raw.json" "$OUT/time.txt" "$OUT/prompt.txt"
python3 - "$OUT" <<'PY'
import glob, json, sys
rows = [json.load(open(f)) for f in sorted(glob.glob(f"{sys.argv[1]}/*-*.json"))]
print("| prompt tokens | policy | prefill s (to first token) | prefill tok/s | decode tok/s | KV allocated MiB | peak RSS MiB |")
print("|---:|---|---:|---:|---:|---:|---:|")
for r in sorted(rows, key=lambda r: (r["prompt_tokens"], r["policy"])):
    ttft = r["time_to_first_token_s"]
    print(f"| {r['prompt_tokens']:,} | `{r['policy']}` | {ttft:.0f} | {r['prompt_tokens'] / ttft:.1f} | "
          f"{r['decode_tok_s']:.2f} | {r['kv_bytes_allocated'] / (1 << 20):.1f} | {r['peak_rss_mib']:,.0f} |")
PY
