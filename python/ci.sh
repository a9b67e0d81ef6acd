#!/usr/bin/env bash
# Installs the Python package as a user would (`pip install ./python`) into a
# fresh virtual environment and runs its pytest suite. Needs Python >= 3.9
# with venv, the Rust toolchain, PyPI (maturin, numpy, pytest, pandas, mypy) and
# ../shared. The extension builds in the workspace's target/ (release
# profile), beside the CLI's build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-$PWD/target/python-venv}
PY=${PYTHON:-python3}
"$PY" -m venv --clear "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check maturin numpy pytest pandas mypy
# maturin from the venv (no isolated build env to download it into again;
# its build backend runs the `maturin` found on PATH)
PATH="$VENV/bin:$PATH" "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation ./python
# the stubs match the extension and the package type-checks against them
(cd "$VENV" && bin/python -m mypy.stubtest kvslim._native && bin/python -m mypy --strict -p kvslim)
# the installed package, not the source folder (python/ is not on sys.path)
"$VENV/bin/python" -m pytest -q python/tests
# the analysis scripts (whole-set tables, choice bias) on the committed merge
"$VENV/bin/python" -m pytest -q scripts/tests
