#!/usr/bin/env bash
# The web page in a real browser: installs Debian's chromium and
# chromium-driver (apt) and Selenium (PyPI, in a venv), starts two
# `kvslim serve` (SmolLM2-135M-Instruct for chat through its template;
# stories260K with --api-key) on free loopback ports, and runs
# scripts/browser_check.py against them. Screenshots go to $OUT
# (default target/browser-check; OUT=docs/img refreshes the README's).
# MODEL=qwen2.5-coder-1.5b CHECK_ARGS='--timeout-scale 4' runs it on the
# 1.5B code model.
# Needs a release build (cargo build --release -p kvslim).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/kvslim}
MODEL=${MODEL:-../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
KEY_MODEL=${KEY_MODEL:-../shared/models/stories260K/stories260K.bin}
OUT=${OUT:-target/browser-check}
VENV=${VENV:-target/browser-venv}

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# Selenium finds no driver to download: chromedriver's path is given, and
# SE_OFFLINE keeps its manager from looking
"$VENV/bin/pip" install -q 'selenium==4.27.1'
export SE_OFFLINE=true

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
KEY_PORT=$(free_port)
KEY=browser-check-key
LOGS=$(mktemp -d)
"$BIN" serve --model "$MODEL" --port "$PORT" 2>"$LOGS/serve.log" &
PID=$!
"$BIN" serve --model "$KEY_MODEL" --port "$KEY_PORT" --api-key "$KEY" 2>"$LOGS/serve-key.log" &
KEY_PID=$!
trap 'kill $PID $KEY_PID 2>/dev/null || true; rm -rf "$LOGS"' EXIT
for port in "$PORT" "$KEY_PORT"; do
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
done
mkdir -p "$OUT"
if ! "$VENV/bin/python" scripts/browser_check.py --url "http://127.0.0.1:$PORT" \
  --key-url "http://127.0.0.1:$KEY_PORT" --key "$KEY" --out "$OUT" ${CHECK_ARGS:-}; then
  echo "== kvslim serve logs" >&2
  tail -n 20 "$LOGS"/*.log >&2
  exit 1
fi
