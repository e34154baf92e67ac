# Sourced by bench.sh and bench_memory.sh: `bench ARGS` runs benchmarks.bench on $backend with
# the peers and precisions of docs/performance.md (timm and keras-hub; float32 and mixed
# bfloat16). Where Keras' "auto" leaves jit_compile off (TensorFlow on a CPU, PyTorch) ours also
# runs with jit_compile=True; on PyTorch timm also runs under torch.compile and ours also with
# the exact GELU.
py=.venv/bin/python

bench() {
  local extra=()
  case "$backend" in
    tensorflow) extra=(--jit-compile auto true) ;;
    torch) extra=(--jit-compile auto true --torch-compile --exact-gelu) ;;
  esac
  KERAS_BACKEND=$backend $py -m benchmarks.bench --precisions float32 bfloat16 \
    --peers timm keras-hub "${extra[@]}" "$@"
}
