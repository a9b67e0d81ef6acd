#!/usr/bin/env bash
# Serving throughput within a fixed KV memory: for each policy, how many
# PROMPT_TOKENS-token requests fit KV_MEMORY and how fast the server goes
# with them all in flight.
#
# Per policy (POLICIES, `;`-separated):
#  1. `kvslim bench --kv-memory` on a PROMPT_TOKENS-token window of
#     PROMPT_FILE plus MAX_TOKENS greedy tokens: the policy's peak KV bytes
#     per request, what the server reserves for one, and B, the requests
#     whose peak fits KV_MEMORY (capped at MAX_BATCH_CAP when set);
#  2. `kvslim serve --kv-memory KV_MEMORY --max-batch B --policy P` (fixed
#     KV slots unless KV_PAGE_SIZE says otherwise, so the server reserves
#     what the bench measured; no prefix cache; no request deadline;
#     `--prefill-chunk PREFILL_CHUNK --prefill-share PREFILL_SHARE`,
#     default 512 and 0.5);
#  3. for each multiple R in ROUNDS (default 1; "1 2" adds a round with as
#     many requests again waiting in the queue): R x B concurrent streamed requests,
#     each its own PROMPT_TOKENS-token window of PROMPT_FILE (cut exactly
#     by the server's tokenizer, sent as ids), MAX_TOKENS new tokens each
#     (sampled, temperature 0.8; a request may end early at EOS, the
#     tokens generated are what is counted), through `kvslim loadtest`:
#     prompt and generated tokens per second of wall time, the requests
#     the server ran at once and its KV bytes in use (largest values seen
#     on /metrics), latency, the server's RSS (the largest sampled during
#     the run; VmHWM, in the JSON, is mostly the moment the weights were
#     loaded: the mapped GGUF and the tensors copied out of it).
# Writes every number to OUT (JSON) and prints a markdown table.
#
#   bash scripts/serve_throughput.sh        # Qwen2.5-Coder-1.5B, 1 GiB, 4,096-token prompts, 64 tokens
#   MODEL=../shared/models/stories260K/stories260K.bin PROMPT_FILE=../shared/data/tinystories/tinystories_val.txt \
#     PROMPT_TOKENS=256 MAX_TOKENS=8 MAX_BATCH_CAP=2 ROUNDS=1 bash scripts/serve_throughput.sh   # a check in seconds
#
# Numbers are only worth publishing from a quiet machine. The server
# prefills one prompt at a time (a slice of layers between decode steps
# while others generate) (about 60 tok/s at 4,096 tokens on 2
# cores), so the default run, 4 + 22 + 79 requests of 4,096 tokens, takes
# about 2 hours there, and ROUNDS="1 2" about 6. Needs a release build
# (cargo build --release -p kvslim).
MODEL=${MODEL:-qwen2.5-coder-1.5b}
. "$(dirname "$0")/serve_lib.sh"
KV_MEMORY=${KV_MEMORY:-1GiB}
PROMPT_TOKENS=${PROMPT_TOKENS:-4096}
MAX_TOKENS=${MAX_TOKENS:-64}
PROMPT_FILE=${PROMPT_FILE:-../shared/data/wikitext2/wiki.test.raw}
POLICIES=${POLICIES:-"full;h2o:heavy=10%,recent=10%;h2o:heavy=10%,recent=10%,kv_dtype=q8"}
ROUNDS=${ROUNDS:-1}
MAX_BATCH_CAP=${MAX_BATCH_CAP:-0}
KV_PAGE_SIZE=${KV_PAGE_SIZE:-0}
PREFILL_CHUNK=${PREFILL_CHUNK:-512}
PREFILL_SHARE=${PREFILL_SHARE:-0.5}
THREADS=${THREADS:-}
OUT=${OUT:-target/serve_throughput.json}
DIR=$(mktemp -d)
PID=
trap '[ -z "$PID" ] || kill "$PID" 2>/dev/null || true; rm -rf "$DIR"' EXIT
mkdir -p "$(dirname "$OUT")"
threads=()
[ -z "$THREADS" ] || threads=(--threads "$THREADS")

IFS=';' read -r -a policies <<<"$POLICIES"
[ "${#policies[@]}" -gt 0 ] || { echo "POLICIES is empty" >&2; exit 1; }
for r in $ROUNDS; do
  [[ "$r" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be positive integers, got '$r'" >&2; exit 1; }
done
: >"$DIR/rows.jsonl"
i=0
failed=0
for policy in "${policies[@]}"; do
  i=$((i + 1))
  echo "== $policy: capacity (kvslim bench --kv-memory $KV_MEMORY)" >&2
  "$BIN" bench --model "$MODEL" "${threads[@]}" --kv-memory "$KV_MEMORY" --prompt-file "$PROMPT_FILE" \
    --prompt-len "$PROMPT_TOKENS" --gen-len "$MAX_TOKENS" --policy "$policy" --json >"$DIR/bench$i.json"
  batch=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["max_batch"])' "$DIR/bench$i.json")
  if [ "$MAX_BATCH_CAP" -gt 0 ] && [ "$batch" -gt "$MAX_BATCH_CAP" ]; then batch=$MAX_BATCH_CAP; fi
  if [ "$batch" -lt 1 ]; then
    echo "$policy: not one request fits $KV_MEMORY" >&2
    python3 -c 'import json,sys; print(json.dumps({"policy": sys.argv[1], "bench": json.load(open(sys.argv[2]))[0], "batch": 0, "runs": []}))' \
      "$policy" "$DIR/bench$i.json" >>"$DIR/rows.jsonl"
    continue
  fi
  PORT=$(free_port)
  "$BIN" serve --model "$MODEL" "${threads[@]}" --port "$PORT" --kv-memory "$KV_MEMORY" --max-batch "$batch" \
    --policy "$policy" --kv-page-size "$KV_PAGE_SIZE" --prefix-cache 0 --request-timeout 0 --prefill-chunk "$PREFILL_CHUNK" --prefill-share "$PREFILL_SHARE" \
    --queue-limit $((4 * batch + 64)) 2>"$DIR/server$i.log" &
  PID=$!
  wait_healthy "$PORT" 3000 || { echo "the server did not come up" >&2; tail -n 20 "$DIR/server$i.log" >&2; exit 1; }
  : >"$DIR/runs$i.jsonl"
  for r in $ROUNDS; do
    n=$((r * batch))
    echo "== $policy: $n concurrent requests of $PROMPT_TOKENS + $MAX_TOKENS tokens (--max-batch $batch)" >&2
    "$BIN" loadtest --url "http://127.0.0.1:$PORT" --clients "$n" --requests "$n" --max-tokens "$MAX_TOKENS" \
      --prompt-file "$PROMPT_FILE" --prompt-tokens "$PROMPT_TOKENS" --kv-policy "$policy" \
      --server-pid "$PID" --watch-metrics --timeout 86400 --json >>"$DIR/runs$i.jsonl" ||
      { echo "$policy: some of the $n requests failed (see errors in the table)" >&2; failed=1; }
  done
  kill -TERM "$PID"
  code=0
  wait "$PID" || code=$?
  PID=
  [ "$code" -eq 0 ] || { echo "$policy: the server exited with $code after SIGTERM" >&2; failed=1; }
  python3 - "$policy" "$DIR/bench$i.json" "$batch" "$DIR/runs$i.jsonl" >>"$DIR/rows.jsonl" <<'EOF'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[4]) if l.strip()]
print(json.dumps({"policy": sys.argv[1], "bench": json.load(open(sys.argv[2]))[0], "batch": int(sys.argv[3]), "runs": runs}))
EOF
done

python3 - "$DIR/rows.jsonl" "$OUT" "$MODEL" "$KV_MEMORY" "$PROMPT_TOKENS" "$MAX_TOKENS" "$PROMPT_FILE" "$KV_PAGE_SIZE" "$PREFILL_CHUNK" "$PREFILL_SHARE" <<'EOF'
import datetime, json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "model": sys.argv[3], "kv_memory": sys.argv[4], "prompt_tokens": int(sys.argv[5]),
    "max_tokens": int(sys.argv[6]), "prompt_file": sys.argv[7], "kv_page_size": int(sys.argv[8]),
    "prefill_chunk": int(sys.argv[9]), "prefill_share": float(sys.argv[10]),
    "cpus": os.cpu_count(), "rows": rows,
}
json.dump(out, open(sys.argv[2], "w"), indent=2)
mib = lambda b: b / 2**20
print(f"{out['model']}, KV memory {out['kv_memory']}, {out['prompt_tokens']}-token prompts + {out['max_tokens']} new tokens, {out['date']}")
print()
print("| policy | KV MiB per request (peak / reserved) | fit (peak / reserved) | sent | ran at once | peak KV in use MiB | prompt tok/s | generated tok/s | total tok/s | wall s | latency p50 s | TTFT p50 / max s | longest stall s | RSS MiB | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    b = r["bench"]
    per = b["peak_kv_bytes"] + b["peak_metadata_bytes"]
    limit = b["kv_memory"]
    fit = f"{b['max_batch']} / {limit // max(b['reserved_bytes'], 1)}"
    head = f"| `{r['policy']}` | {mib(per):.2f} / {mib(b['reserved_bytes']):.2f} | {fit} "
    if not r["runs"]:
        print(head + "| 0 | - | - | - | - | - | - | - | - | - | - | - |")
    for x in r["runs"]:
        rss = x.get("rss_max_sampled_bytes")
        print(head + f"| {x['requests']} | {x['peak_running_requests']:.0f} | {mib(x['peak_kv_bytes_in_use']):.0f} "
              f"| {x['prompt_tokens_per_s']:.1f} | {x['tokens_per_s']:.1f} | {x['total_tokens_per_s']:.1f} "
              f"| {x['wall_s']:.1f} | {x['latency_p50_s']:.1f} | {x['ttft_p50_s']:.1f} / {x.get('ttft_max_s', 0):.1f} "
              f"| {x.get('stall_max_s', 0):.1f} | {'-' if rss is None else f'{mib(rss):.0f}'} | {x['errors']} |")
print()
print(f"written to {sys.argv[2]}")
EOF
exit "$failed"
