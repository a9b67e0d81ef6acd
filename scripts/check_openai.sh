#!/usr/bin/env bash
# Installs the official `openai` package, starts `kvslim serve` on
# stories260K on a free loopback port, runs scripts/openai_client_check.py
# against it and stops the server. Needs a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-../shared/models/stories260K/stories260K.bin}
BIN=${BIN:-target/release/kvslim}
python3 -m pip install -q openai
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN" serve --model "$MODEL" --port "$PORT" &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.1
done
python3 scripts/openai_client_check.py "http://127.0.0.1:$PORT/v1"
