#!/usr/bin/env bash
# Makes README's peak-memory table (docs/bench/memory/): per backend, Ti/16 and the main job's
# model at batch 32 (first inference call, then first training step) and B/16 inference at
# batch 32, in float32 and mixed bfloat16, each implementation in a process of its own. Memory
# does not depend on how busy the machine is, so this may run beside other work. Arguments:
# the backends to measure (all three if none).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh

mkdir -p docs/bench/memory
backends=("$@")
[ $# -eq 0 ] && backends=(tensorflow jax torch)
for backend in "${backends[@]}"; do
  bench --memory --variants Ti/16 main --json "docs/bench/memory/$backend.json"
  bench --memory --variants B/16 --skip-training \
    --json "docs/bench/memory/$backend-b16.json"
done
$py -m apps.readme --write
