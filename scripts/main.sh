#!/usr/bin/env bash
# The Fashion-MNIST reference run: sets everything up, trains a small ViT on Fashion-MNIST,
# evaluates it on the test split and saves it (runs/fashion_mnist/). Extra arguments go to
# `python -m apps.train`.
# PyTorch unless KERAS_BACKEND says otherwise: the fastest backend for this model on the
# project's CPUs (docs/performance.md, "Training on Fashion-MNIST", the backends' table).
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
# glibc keeps the memory a training step frees for the next step's tensors, where by default
# it hands large blocks back to the kernel and faults them in again, zeroed, at every step
# (notes/mainjob.md, the allocator); the same settings on every host, the training unchanged.
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-33554432}  # 32 MiB, glibc's largest
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-4294967296}
KERAS_BACKEND=${KERAS_BACKEND:-torch} .venv/bin/python -m apps.train "$@"
