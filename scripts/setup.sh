#!/usr/bin/env bash
# Creates .venv with vit_keras and every backend (idempotent), on Python 3.11 (what CI tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[cpu,jax,torch,export,test,cv]"
# keras-hub is the benchmark's Keras peer. Its tensorflow-text requirement would pull the full
# tensorflow wheel over tensorflow-cpu; ViTBackbone needs none of its text or download extras.
.venv/bin/python -m pip install --quiet --no-deps keras-hub==0.32.0
