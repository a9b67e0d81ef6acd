#!/usr/bin/env bash
# Two `kvslim serve` replicas behind nginx (least-connections) on loopback.
#
#  1. starts replicas A and B and nginx in front of them (nginx from Debian's
#     packages; installed with apt-get when missing and we are root);
#  2. runs `kvslim loadtest` (streaming clients) through nginx and kills
#     replica A with SIGKILL while requests are in flight;
#  3. checks: every failed request failed cleanly (the client saw an error
#     status or a stream cut off before [DONE], never a hang), requests
#     after the kill are served by B, a second load test with A gone has no
#     error at all, and B's KV bytes are back to 0.
#
# Prints the load reports, nginx's answers per upstream and status, and
# B's counters. Needs a release build (cargo build --release -p kvslim).
#   CLIENTS=16 REQUESTS=400 KILL_AFTER=3 bash scripts/replicas.sh
. "$(dirname "$0")/serve_lib.sh"
CLIENTS=${CLIENTS:-16}
REQUESTS=${REQUESTS:-400}
MAX_TOKENS=${MAX_TOKENS:-200}
KILL_AFTER=${KILL_AFTER:-3}

if ! command -v nginx >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing nginx (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx >/dev/null
  else
    echo "error: nginx not found; install it (Debian: apt-get install nginx)" >&2
    exit 1
  fi
fi
NGINX=$(command -v nginx)

DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
PA=$(free_port); PB=$(free_port); PN=$(free_port)

serve() { # name port
  "$BIN" serve --model "$MODEL" --port "$2" --max-batch 8 --queue-limit 256 --kv-memory 256MiB \
    --served-model-name "replica-$1" 2>"$DIR/$1.log" &
  PIDS+=($!)
}
serve a "$PA"; PID_A=${PIDS[0]}
serve b "$PB"; PID_B=${PIDS[1]}
for p in "$PA" "$PB"; do
  wait_healthy "$p" 200 || { echo "replica on :$p did not start" >&2; cat "$DIR"/*.log >&2; exit 1; }
done

# least_conn: a new request goes to the replica with fewer open ones; a
# replica that refuses the connection is skipped (the request was not
# sent, so even a POST may go to the next one) and rested for 30 s.
# Responses are streamed through unbuffered.
cat >"$DIR/nginx.conf" <<EOF
worker_processes 1;
pid $DIR/nginx.pid;
error_log $DIR/nginx-error.log warn;
daemon off;
events { worker_connections 1024; }
http {
  log_format upstream '\$msec \$status \$upstream_addr \$upstream_status \$request_time';
  access_log $DIR/access.log upstream;
  client_body_temp_path $DIR/body;
  proxy_temp_path $DIR/proxy;
  upstream kvslim {
    least_conn;
    server 127.0.0.1:$PA max_fails=1 fail_timeout=30s;
    server 127.0.0.1:$PB max_fails=1 fail_timeout=30s;
    keepalive 32;
  }
  server {
    listen 127.0.0.1:$PN;
    location / {
      proxy_pass http://kvslim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
      proxy_next_upstream error timeout;
      proxy_next_upstream_tries 2;
    }
  }
}
EOF
"$NGINX" -p "$DIR" -c "$DIR/nginx.conf" -e "$DIR/nginx-error.log" &
PIDS+=($!)
wait_healthy "$PN"

echo "== load through nginx (:$PN → A :$PA, B :$PB); A killed after ${KILL_AFTER}s"
"$BIN" loadtest --url "http://127.0.0.1:$PN" --clients "$CLIENTS" --requests "$REQUESTS" \
  --max-tokens "$MAX_TOKENS" --json >"$DIR/load1.json" 2>"$DIR/load1.err" &
LOAD=$!
sleep "$KILL_AFTER"
KILLED_AT=$(date +%s.%N)
kill -KILL "$PID_A"
echo "killed replica A (pid $PID_A) at $KILLED_AT"
wait "$LOAD" || true
cat "$DIR/load1.json"

echo "== load through nginx with A gone"
status=0
"$BIN" loadtest --url "http://127.0.0.1:$PN" --clients "$CLIENTS" --requests $((REQUESTS / 4)) \
  --max-tokens "$MAX_TOKENS" --json >"$DIR/load2.json" 2>"$DIR/load2.err" || status=$?
cat "$DIR/load2.json"

echo "== nginx's answers: status, upstream (before | after the kill)"
awk -v k="$KILLED_AT" '{ side = ($1 < k) ? "before" : "after"; n[side " " $2 " " $3]++ }
  END { for (x in n) print n[x], x }' "$DIR/access.log" | sort -k2,2 -k3,3 -k4
echo "== replica B"
curl -sf "http://127.0.0.1:$PB/metrics" | grep -E '^kvslim_(requests_total|requests_cancelled_total|kv_bytes_in_use|generated_tokens_total) '

python3 - "$DIR" "$KILLED_AT" "$PA" "$status" <<'EOF'
import json, sys
d, killed_at, pa, status = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
l1, l2 = (json.load(open(f"{d}/load{i}.json")) for i in (1, 2))
clean = {"http_502", "http_503", "http_504", "stream_cut"}
bad = {k: v for k, v in l1["errors_by_kind"].items() if k not in clean}
problems = []
if l1["ok"] + l1["errors"] != l1["requests"]:
    problems.append(f"first load: {l1['ok']} ok + {l1['errors']} errors != {l1['requests']} requests")
if bad:
    problems.append(f"first load: unclean failures {bad}")
if status != 0 or l2["errors"]:
    problems.append(f"second load (A gone): {l2['errors']} errors {l2['errors_by_kind']}")
# after the kill no answer comes from A (lines logged after it may still
# name A as the first try when nginx passed the request on to B)
after = [l.split() for l in open(f"{d}/access.log") if float(l.split()[0]) > killed_at + 1]
served_by_a = [l for l in after if l[2].endswith(":" + pa) and l[1] == "200"]
if served_by_a:
    problems.append(f"{len(served_by_a)} answers from A after it was killed")
print(f"first load: {l1['ok']} ok, failures {l1['errors_by_kind']}; second load: {l2['ok']} ok, {l2['errors']} errors")
if problems:
    print("FAILED:\n  " + "\n  ".join(problems))
    sys.exit(1)
print("PASSED: failures were clean, the survivor served everything after the kill")
EOF
kv=$(curl -sf "http://127.0.0.1:$PB/metrics" | awk '$1 == "kvslim_kv_bytes_in_use" { print $2 }')
[ "$kv" = 0 ] || { echo "FAILED: replica B holds $kv KV bytes at the end" >&2; exit 1; }
