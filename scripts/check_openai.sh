#!/usr/bin/env bash
# Installs the official `openai` package, starts `kvslim serve` on
# stories260K on a free loopback port, runs scripts/openai_client_check.py
# against it and stops the server. Needs a release build (cargo build --release).
. "$(dirname "$0")/serve_lib.sh"
python3 -m pip install -q openai
PORT=$(free_port)
"$BIN" serve --model "$MODEL" --port "$PORT" &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
wait_healthy "$PORT"
python3 scripts/openai_client_check.py "http://127.0.0.1:$PORT/v1"
