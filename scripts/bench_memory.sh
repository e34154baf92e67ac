#!/usr/bin/env bash
# Makes the peak-memory table of docs/performance.md (docs/bench/memory/): per backend, Ti/16 at
# batch 32 (first inference call, then the first and the second training step) in float32 and
# mixed bfloat16, each implementation in a process of its own. Memory does not depend on how
# busy the machine is, so this may run beside other work. Arguments: the backends to measure
# (all three if none).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh

mkdir -p docs/bench/memory
backends=("$@")
[ $# -eq 0 ] && backends=(tensorflow jax torch)
for backend in "${backends[@]}"; do
  bench --memory --variants Ti/16 --json "docs/bench/memory/$backend.json"
done
$py -m benchmarks.render --write
