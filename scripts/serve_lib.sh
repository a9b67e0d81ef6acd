# Sourced by the scripts that run `kvslim serve`: strict mode, the
# repository root as the working directory, the binary and the model
# (stories260K unless MODEL names another), a free loopback port and a
# wait for a server's /health.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-target/release/kvslim}
MODEL=${MODEL:-../shared/models/stories260K/stories260K.bin}

# Prints a free loopback port.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits until http://127.0.0.1:$1/health answers, trying every 0.1 s up to
# $2 times (default 100); fails if it never does.
wait_healthy() {
  for _ in $(seq "${2:-100}"); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
