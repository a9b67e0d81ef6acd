#!/usr/bin/env bash
# Installs the Python package as a user would (`pip install ./python`) into a
# fresh virtual environment and runs its pytest suite. Needs Python >= 3.9
# with venv, the Rust toolchain, PyPI (maturin, numpy, pytest, pandas) and
# ../shared. The build shares the workspace's target/ (release), so after
# `cargo build --release` only the extension itself is compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-$PWD/target/python-venv}
PY=${PYTHON:-python3}
"$PY" -m venv --clear "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check maturin numpy pytest pandas
# maturin from the venv (no isolated build env to download it into again;
# its build backend runs the `maturin` found on PATH)
PATH="$VENV/bin:$PATH" "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation ./python
# the installed package, not the source folder: run from outside python/
"$VENV/bin/python" -m pytest -q python/tests
