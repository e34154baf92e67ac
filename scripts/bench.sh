#!/usr/bin/env bash
# Makes README's Performance tables (docs/bench/): per backend, Ti/16 and the main job's model
# at batch 32 with training; then B/16 inference at 224 px across batch sizes and at 384 px.
# timm runs once, beside TensorFlow (it does not depend on the Keras backend). About 35
# minutes on the 2-core CI machine; run it with nothing else busy.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python

bench() {
  KERAS_BACKEND=$backend $py -m apps.bench --precisions float32 --peers $peers "$@"
}

mkdir -p docs/bench/scaling
for backend in tensorflow jax torch; do
  peers=keras-hub
  [ "$backend" = tensorflow ] && peers="timm keras-hub"
  bench --variants Ti/16 main --repeats 3 --json "docs/bench/$backend.json"
  bench --variants B/16 --image-size 224 --batch 1 8 32 --skip-training --repeats 3 \
    --warmup 1 --json "docs/bench/scaling/$backend-224.json"
  bench --variants B/16 --image-size 384 --batch 8 --skip-training --repeats 3 --warmup 1 \
    --json "docs/bench/scaling/$backend-384.json"
done
$py -m apps.readme --write
