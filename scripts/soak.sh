#!/usr/bin/env bash
# The long soak: starts `kvslim serve` on stories260K (API key from a file,
# short header timeout so stalled clients resolve quickly), runs
# `kvslim loadtest --soak` against it with CLIENTS clients for DURATION
# seconds, then sends SIGTERM and checks the server drains and exits 0.
# Prints the soak's JSON report (requests by kind, answers by status,
# latency percentiles, KV bytes at the end, the server's peak RSS).
# Needs a release build (cargo build --release -p kvslim).
#   CLIENTS=64 DURATION=600 bash scripts/soak.sh
. "$(dirname "$0")/serve_lib.sh"
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-600}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/key"
PORT=$(free_port)
"$BIN" serve --model "$MODEL" --port "$PORT" --api-key-file "$DIR/key" \
  --max-batch 16 --queue-limit 128 --kv-memory 256MiB \
  --max-body-bytes 1MiB --header-timeout 2 --body-timeout 10 --grace-period 30 2>"$DIR/server.log" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
wait_healthy "$PORT"
status=0
KVSLIM_API_KEY=$(cat "$DIR/key") "$BIN" loadtest --url "http://127.0.0.1:$PORT" --soak "$DURATION" \
  --clients "$CLIENTS" --max-tokens 48 --server-pid "$PID" --oversize-bytes 2MiB --stalled || status=$?
kill -TERM "$PID"
code=0
wait "$PID" || code=$?
echo "server exit code after SIGTERM: $code" >&2
tail -n 3 "$DIR/server.log" >&2
[ "$code" -eq 0 ] || exit 1
exit "$status"
