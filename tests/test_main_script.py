"""scripts/main.sh: sets .venv up, then runs apps.train on PyTorch unless KERAS_BACKEND says
otherwise, with glibc's allocator keeping the memory a step frees; the caller's own settings and
flags pass through. A stand-in .venv/bin/python records what it was run with."""

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import backend_independent
from tests.test_setup_script import calls, checkout_with_venv

ROOT = Path(__file__).resolve().parent.parent
RECORDING_PYTHON = ('#!/usr/bin/env bash\necho "$KERAS_BACKEND $MALLOC_MMAP_THRESHOLD_ '
                    '$MALLOC_TRIM_THRESHOLD_ $*" >> "$(dirname "$0")/../calls.txt"\n')


def main_sh(folder: Path, **env: str) -> subprocess.CompletedProcess:
    unset = ("KERAS_BACKEND", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    environment = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(["bash", "scripts/main.sh", "--epochs", "1"], cwd=folder,
                          env={**environment, **env}, capture_output=True, text=True)


@backend_independent
def test_main_job_trains_on_torch_with_the_allocator_keeping_freed_memory(tmp_path):
    folder, _ = checkout_with_venv(tmp_path, "main")  # set up already: setup.sh runs nothing
    shutil.copy(ROOT / "scripts" / "main.sh", folder / "scripts" / "main.sh")
    (folder / ".venv" / "bin" / "python").write_text(RECORDING_PYTHON)
    done = main_sh(folder)
    assert done.returncode == 0, done.stderr
    assert calls(folder) == ["torch 33554432 4294967296 -m apps.train --epochs 1"]
    done = main_sh(folder, KERAS_BACKEND="jax", MALLOC_TRIM_THRESHOLD_="0")
    assert done.returncode == 0, done.stderr
    assert calls(folder)[1:] == ["jax 33554432 0 -m apps.train --epochs 1"]
