"""The order a user writes imports in must not crash the process on any backend."""

import os
import subprocess
import sys

from tests.conftest import backend_independent

BACKENDS = ("tensorflow", "jax", "torch")


@backend_independent  # it starts one process per backend itself
def test_import_vit_keras_then_timm_on_every_backend():
    # Before vit_keras loaded Triton's library ahead of TensorFlow, the tensorflow process
    # died with a segfault (exit -11) at `import timm`.
    code = "import vit_keras; import timm; print('ok')"
    processes = {
        backend: subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "KERAS_BACKEND": backend})
        for backend in BACKENDS}
    for backend, process in processes.items():
        stdout, stderr = process.communicate(timeout=300)
        assert (process.returncode, stdout.strip()) == (0, "ok"), (backend, stderr[-2000:])
