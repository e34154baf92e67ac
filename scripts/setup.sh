#!/usr/bin/env bash
# Creates .venv on Python 3.11 (what CI tests) with vit_keras and all three Keras backends, in
# one pip run. `setup.sh main` stops there (what the main job needs); `setup.sh test`, the
# default, installs the test, export, cv and docs extras in that same run, then keras-hub. A
# .venv set up for the same or a larger purpose from the same pyproject.toml and this script is
# left as it is (its stamp says so), so a second run costs no pip resolution. Prints its
# seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
purpose=${1:-test}
case $purpose in
  main) extras="cpu,jax,torch" ;;
  test) extras="cpu,jax,torch,export,test,cv,docs" ;;
  *) echo "setup.sh: expected 'main' or 'test', got '$purpose'" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3.11}
stamp=.venv/setup-stamp
wanted=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && { [ "$(cat "$stamp" 2>/dev/null)" = "$wanted test" ] ||
                                 [ "$(cat "$stamp" 2>/dev/null)" = "$wanted $purpose" ]; }; then
  echo "set-up: .venv is ready for '$purpose' (0 s)"
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# The venv's own pip: upgrading it first would be a second download and install.
.venv/bin/python -m pip install --quiet -e ".[$extras]"
if [ "$purpose" = test ]; then
  # keras-hub is the benchmark's Keras peer. Its tensorflow-text requirement would pull the
  # full tensorflow wheel over tensorflow-cpu; ViTBackbone needs none of its text or download
  # extras. --no-deps: no resolution, nothing installed twice.
  .venv/bin/python -m pip install --quiet --no-deps keras-hub==0.32.0
fi
echo "$wanted $purpose" > "$stamp"
echo "set-up: .venv installed for '$purpose' in $SECONDS s"
