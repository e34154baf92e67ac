#!/usr/bin/env bash
# Makes README's Performance tables (docs/bench/): per backend, Ti/16 and the main job's model
# at batch 32 with training; then B/16 inference at 224 px across batch sizes and at 384 px;
# each in float32 and mixed bfloat16 (timm under torch.autocast); on TensorFlow S/16 and B/16
# in float32 with and without XLA, training too, without peers; then peak memory
# (scripts/bench_memory.sh).
# timm and keras-hub run beside every backend, so that each table compares within one run.
# Beside PyTorch, ours and timm also run under torch.compile, and ours also with the exact
# GELU that timm and keras-hub compute (PyTorch eager runs the two GELUs as different kernels,
# the others fuse them under XLA; in bfloat16 ours computes the exact one anyway, so there the
# two rows time one computation twice). Run it with nothing else busy: another process's load
# slowed timm 10x (torch's threads wait for cores) in a run that was thrown away.
# Arguments: the backends to measure (all three if none), e.g. `scripts/bench.sh tensorflow`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh

mkdir -p docs/bench/scaling docs/bench/xla-width
backends=("$@")
[ $# -eq 0 ] && backends=(tensorflow jax torch)
for backend in "${backends[@]}"; do
  bench --variants Ti/16 main --repeats 3 --json "docs/bench/$backend.json"
  # batch 1 is every row's latency column
  bench --variants B/16 --image-size 224 --batch 8 32 --skip-training --repeats 3 \
    --warmup 1 --json "docs/bench/scaling/$backend-224.json"
  bench --variants B/16 --image-size 384 --batch 8 --skip-training --repeats 3 --warmup 1 \
    --json "docs/bench/scaling/$backend-384.json"
  # the float32 width from which TensorFlow's CPU default leaves XLA off (XLA_WIDTH_LIMITS)
  if [ "$backend" = tensorflow ]; then
    KERAS_BACKEND=tensorflow $py -m apps.bench --variants S/16 B/16 --precisions float32 \
      --peers --repeats 3 --json docs/bench/xla-width/tensorflow.json
  fi
done
bash scripts/bench_memory.sh "${backends[@]}"
