#!/usr/bin/env bash
# The documentation site's strict build, then the whole suite, once per Keras backend; fails
# if the build warns, if any backend fails, runs no test, or has a test over the per-test
# budget (tests/budget.py). Prints each backend's wall time, its closing line and the set-up's
# time at the end. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
bash scripts/setup.sh
# The end-to-end tests train on real Fashion-MNIST (Debian's package, MIT licence).
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi
summary="set-up $((SECONDS - started)) s"
.venv/bin/ruff check vit_keras apps benchmarks tests
log=$(mktemp)
site=$(mktemp -d)
trap 'rm -rf "$log" "$site"' EXIT
# The documentation site, strict: a broken link, a page outside the navigation or a docstring
# that names a parameter the signature lacks fails here. It reads the docstrings statically,
# without importing a backend.
docs_started=$SECONDS
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
summary+=$'\n'"docs $((SECONDS - docs_started)) s: mkdocs build --strict"
for backend in ${BACKENDS:-tensorflow jax torch}; do
  echo "=== KERAS_BACKEND=$backend"
  backend_started=$SECONDS
  # pytest exits 5 when it collects no test: that is a failure here too.
  # Two worker processes, one a core (tests/conftest.py caps each one's math threads at its
  # share): most tests wait on Python and tracing rather than on both cores, so this about
  # halves the suite's time.
  # A test module stays on one worker (--dist loadscope), so its module fixtures run once;
  # each page of the docs is a test class of its own, so the pages spread (tests/test_docs.py).
  KERAS_BACKEND=$backend .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 \
    --dist loadscope --durations=25 "$@" tests | tee "$log"
  summary+=$'\n'"$backend $((SECONDS - backend_started)) s: $(tail -n 1 "$log" | tr -d '=')"
done
# The numerical parity tests (marked parity: the NumPy reference, timm's, a training step)
# again on PyTorch with every fast path off, the general path they are checked against.
if [[ " ${BACKENDS:-torch} " == *" torch "* ]]; then
  echo "=== KERAS_BACKEND=torch VIT_KERAS_FAST_PATHS=0 (parity tests)"
  parity_started=$SECONDS
  VIT_KERAS_FAST_PATHS=0 KERAS_BACKEND=torch .venv/bin/python -m pytest -q -p no:cacheprovider \
    -n 2 --dist loadscope -m parity "$@" tests | tee "$log"
  summary+=$'\n'"torch, fast paths off $((SECONDS - parity_started)) s: $(tail -n 1 "$log" | tr -d '=')"
fi
echo "=== wall time per backend"
echo "$summary"
echo "total $((SECONDS - started)) s"
