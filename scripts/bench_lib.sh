# Sourced by bench.sh and bench_memory.sh: `bench ARGS` runs benchmarks.bench on $backend with the
# peers and precisions of README's tables (timm and keras-hub; float32 and mixed bfloat16),
# adding on PyTorch torch.compile and our model with the exact GELU.
py=.venv/bin/python

bench() {
  local torch_only=()
  [ "$backend" = torch ] && torch_only=(--torch-compile --exact-gelu)
  KERAS_BACKEND=$backend $py -m benchmarks.bench --precisions float32 bfloat16 --peers timm keras-hub \
    "${torch_only[@]}" "$@"
}
