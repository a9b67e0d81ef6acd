# Sourced by the scripts that run kvslim on Qwen2.5-Coder for docs/qwen:
# strict mode, the repository root as the working directory, the binary
# (which must be built), the model, ../shared and the results folder
# (OUT, default docs/qwen/$1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-target/release/kvslim}
MODEL=${MODEL:-qwen2.5-coder-1.5b}
SHARED=${KVSLIM_SHARED:-../shared}
OUT=${OUT:-docs/qwen/$1}
[ -x "$BIN" ] || { echo "error: $BIN missing; run cargo build --release -p kvslim" >&2; exit 1; }
