#!/usr/bin/env bash
# Makes the tables of docs/performance.md (docs/bench/): per backend, Ti/16 and the main job's
# model at batch 32 with training; B/16 inference at 224 px across batch sizes and at 384 px;
# each in float32 and mixed bfloat16, with timm and keras-hub in the same run; then peak
# memory (scripts/bench_memory.sh). Run it on an otherwise idle machine.
# Arguments: the backends to measure (all three if none), e.g. `scripts/bench.sh tensorflow`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh

mkdir -p docs/bench/scaling
backends=("$@")
[ $# -eq 0 ] && backends=(tensorflow jax torch)
for backend in "${backends[@]}"; do
  bench --variants Ti/16 main --repeats 3 --json "docs/bench/$backend.json"
  # batch 1 is every row's latency column
  bench --variants B/16 --image-size 224 --batch 8 32 --skip-training --repeats 3 \
    --warmup 1 --json "docs/bench/scaling/$backend-224.json"
  bench --variants B/16 --image-size 384 --batch 8 --skip-training --repeats 3 --warmup 1 \
    --json "docs/bench/scaling/$backend-384.json"
done
bash scripts/bench_memory.sh "${backends[@]}"
