#!/usr/bin/env bash
# The soak on a real-size model: `kvslim serve` on Qwen2.5-Coder-1.5B
# (GGUF Q4_K_M, 1.1 GB; `kvslim fetch qwen2.5-coder-1.5b` once), CLIENTS
# clients for DURATION seconds on PROMPT_TOKENS-token windows of
# WikiText-2 (cut exactly by the server's tokenizer, sent as token ids)
# under a mix of per-request KV policies, then SIGTERM; as scripts/soak.sh
# otherwise (API key from a file, short header timeout, stalled clients).
# Prints the soak's JSON report, then a summary: answers by status, KV
# bytes at the end, and the server's RSS against the weights' size
# (`kvslim info`) and the KV pool. Loading a GGUF maps the file and copies
# the tensors out, so the file's pages and the copies are both resident
# for a moment (VmHWM ≈ 2 × weights right after loading); the bound is
# checked on the serving phase: the RSS sampled every second during the
# load, and VmHWM at the end where it rose above its value after loading.
# Fails on any unexpected answer, KV not back to 0, a server exit other
# than 0, or a serving RSS above weights + KV_MEMORY + RSS_SLACK_MIB (the
# prefix cache's prompt pages, prefill buffers, the allocator).
#   bash scripts/soak_qwen.sh                      # 8 clients, 10 minutes
#   SEED=101 bash scripts/soak_qwen.sh             # beam and oversized requests among the first draws
#   CLIENTS=2 DURATION=60 PROMPT_TOKENS=512 bash scripts/soak_qwen.sh
# Needs a release build (cargo build --release -p kvslim).
MODEL=${MODEL:-qwen2.5-coder-1.5b}
. "$(dirname "$0")/serve_lib.sh"
CLIENTS=${CLIENTS:-8}
DURATION=${DURATION:-600}
PROMPT_TOKENS=${PROMPT_TOKENS:-2048}
PROMPT_FILE=${PROMPT_FILE:-../shared/data/wikitext2/wiki.test.raw}
MAX_TOKENS=${MAX_TOKENS:-32}
# 8 full 2K requests reserve 8 x 2,081 x 57,344 B = 0.95 GB; a beam request
# (3 beams, reserved as 6 sequences) 0.71 GB; cancelled ones ask for 400
# tokens and up to 3 choices. What does not fit waits in the queue.
KV_MEMORY=${KV_MEMORY:-2GiB}
POLICIES=${POLICIES:-"full;h2o:heavy=10%,recent=10%;h2o:heavy=10%,recent=10%,prefill=snap:32;window:recent=512"}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-600}
RSS_SLACK_MIB=${RSS_SLACK_MIB:-1024}
# the clients' draws (`--seed`); on this model 10 minutes hold only ~5
# requests per client, and with seed 1 none is a beam search or an
# oversized body: SEED=101 puts both among the first 4 draws of the clients
SEED=${SEED:-1}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/key"
WEIGHT_BYTES=$("$BIN" info --model "$MODEL" | awk '$1 == "weight" && $2 == "bytes" {print $3}')
[ -n "$WEIGHT_BYTES" ] || { echo "kvslim info gave no weight bytes for $MODEL" >&2; exit 1; }
PORT=$(free_port)
"$BIN" serve --model "$MODEL" --port "$PORT" --api-key-file "$DIR/key" \
  --max-batch 16 --queue-limit 128 --kv-memory "$KV_MEMORY" --request-timeout "$REQUEST_TIMEOUT" \
  --max-body-bytes 1MiB --header-timeout 2 --body-timeout 10 --grace-period 60 2>"$DIR/server.log" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
# loading 1.1 GB on a busy machine: up to 5 minutes
wait_healthy "$PORT" 3000 || { echo "the server did not come up" >&2; tail -n 20 "$DIR/server.log" >&2; exit 1; }
# the server's RSS and VmHWM after loading, in bytes (/proc gives kB)
LOAD_HWM=$(($(awk '$1 == "VmHWM:" {print $2}' "/proc/$PID/status") * 1024))
LOAD_RSS=$(($(awk '$1 == "VmRSS:" {print $2}' "/proc/$PID/status") * 1024))
echo "server up (pid $PID): $MODEL, --kv-memory $KV_MEMORY; soak of $DURATION s, $CLIENTS clients," \
  "$PROMPT_TOKENS-token prompts from $PROMPT_FILE, policies $POLICIES" >&2
status=0
KVSLIM_API_KEY=$(cat "$DIR/key") "$BIN" loadtest --url "http://127.0.0.1:$PORT" --soak "$DURATION" \
  --clients "$CLIENTS" --max-tokens "$MAX_TOKENS" --server-pid "$PID" --oversize-bytes 2MiB --stalled \
  --prompt-file "$PROMPT_FILE" --prompt-tokens "$PROMPT_TOKENS" --kv-policies "$POLICIES" --seed "$SEED" \
  >"$DIR/report.json" || status=$?
cat "$DIR/report.json"
kill -TERM "$PID"
code=0
wait "$PID" || code=$?
echo "server exit code after SIGTERM: $code" >&2
tail -n 3 "$DIR/server.log" >&2
[ -s "$DIR/report.json" ] || { echo "no soak report" >&2; exit 1; }
rss_ok=0
python3 - "$DIR/report.json" "$WEIGHT_BYTES" "$KV_MEMORY" "$RSS_SLACK_MIB" "$LOAD_HWM" "$LOAD_RSS" <<'EOF' || rss_ok=$?
import json, re, sys
r = json.load(open(sys.argv[1]))
weights = int(sys.argv[2])
m = re.fullmatch(r"(\d+)\s*(|B|KiB|MiB|GiB)", sys.argv[3].strip())
kv_limit = int(m.group(1)) * {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
slack = int(sys.argv[4]) << 20
load_hwm, load_rss = int(sys.argv[5]), int(sys.argv[6])
mib = lambda b: "-" if b is None else f"{b / 2**20:,.0f} MiB"
peak = r["peak_rss_bytes"]
print(f"requests {r['requests']} in {r['duration_s']:.0f} s: {r['requests_by_kind']}", file=sys.stderr)
print(f"answers by status {r['responses_by_status']}; unexpected {r['unexpected']}", file=sys.stderr)
print(f"KV bytes in use at the end {r['kv_bytes_at_end']:.0f} (largest seen {r['kv_bytes_in_use_max_sampled']:.0f})", file=sys.stderr)
print(f"server RSS: after loading {mib(load_rss)} (VmHWM {mib(load_hwm)} while loading); "
      f"when the load started {mib(r['rss_at_start_bytes'])}, largest sampled during it {mib(r['rss_max_sampled_bytes'])}, "
      f"at the end {mib(r['rss_at_end_bytes'])}; VmHWM at the end {mib(peak)}", file=sys.stderr)
sampled = r["rss_max_sampled_bytes"]
if sampled is None or peak is None:
    print("the server's RSS was not measured", file=sys.stderr)
    sys.exit(1)
serving = max(sampled, peak if peak > load_hwm else 0)
bound = weights + kv_limit + slack
print(f"serving RSS {mib(serving)} = weights {mib(weights)} + {mib(serving - weights)}; "
      f"bound weights + KV pool {mib(kv_limit)} + slack {mib(slack)} = {mib(bound)}", file=sys.stderr)
if serving > bound:
    print("serving RSS above the bound", file=sys.stderr)
    sys.exit(1)
EOF
[ "$code" -eq 0 ] || exit 1
[ "$rss_ok" -eq 0 ] || exit 1
exit "$status"
