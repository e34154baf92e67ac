#!/usr/bin/env bash
# Makes the speed table of docs/performance.md (docs/bench/BACKEND.json): per backend, Ti/16 and
# the Fashion-MNIST model's blocks (`main`) at batch 32 with training, in float32 and mixed
# bfloat16 (timm under torch.autocast), beside timm and keras-hub (scripts/bench_lib.sh). Then
# peak memory (scripts/bench_memory.sh), and the tables rendered into docs/. Timings need a
# machine with nothing else busy.
# Arguments: the backends to measure (all three if none), e.g. `scripts/bench.sh tensorflow`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh

backends=("$@")
[ $# -eq 0 ] && backends=(tensorflow jax torch)
for backend in "${backends[@]}"; do
  bench --variants Ti/16 main --repeats 3 --json "docs/bench/$backend.json"
done
bash scripts/bench_memory.sh "${backends[@]}"
$py -m benchmarks.render --write
