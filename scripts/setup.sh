#!/usr/bin/env bash
# Creates .venv with vit_keras and every backend, on Python 3.11 (what CI tests). A .venv set
# up from the same pyproject.toml and this script is left as it is (its stamp says so), so a
# second run costs no pip resolution.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
stamp=.venv/setup-stamp
wanted=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[cpu,jax,torch,export,test,cv]"
# keras-hub is the benchmark's Keras peer. Its tensorflow-text requirement would pull the full
# tensorflow wheel over tensorflow-cpu; ViTBackbone needs none of its text or download extras.
.venv/bin/python -m pip install --quiet --no-deps keras-hub==0.32.0
echo "$wanted" > "$stamp"
