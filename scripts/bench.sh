#!/usr/bin/env bash
# Makes the speed tables of docs/performance.md (docs/bench/): per backend, Ti/16 and the main
# job's model at batch 32 with training; then B/16 inference at 224 px across batch sizes and at
# 384 px; each in float32 and mixed bfloat16 (timm under torch.autocast), beside timm and
# keras-hub (scripts/bench_lib.sh); on TensorFlow S/16 and B/16 in float32 with jit_compile
# auto and true, training too, without peers. Then peak memory (scripts/bench_memory.sh), and
# the tables rendered into docs/. Timings need a machine with nothing else busy.
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
  if [ "$backend" = tensorflow ]; then
    KERAS_BACKEND=tensorflow $py -m benchmarks.bench --variants S/16 B/16 --precisions float32 \
      --peers --jit-compile auto true --repeats 3 --json docs/bench/xla-width/tensorflow.json
  fi
done
bash scripts/bench_memory.sh "${backends[@]}"
$py -m benchmarks.render --write
