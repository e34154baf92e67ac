#!/usr/bin/env bash
# The main job: sets everything up, trains a small ViT on Fashion-MNIST, evaluates it on the
# test split and saves it (runs/fashion_mnist/). Extra arguments go to `python -m apps.train`.
# PyTorch unless KERAS_BACKEND says otherwise: the fastest backend for this model on the
# project's CPUs (docs/mainjob.md, the backends' table).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh main
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    echo "Fashion-MNIST is missing: run 'sudo apt-get install dataset-fashion-mnist'," \
         "or pass --data-dir with the four IDX files." >&2
  fi
fi
KERAS_BACKEND=${KERAS_BACKEND:-torch} .venv/bin/python -m apps.train "$@"
