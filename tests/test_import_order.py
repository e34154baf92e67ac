"""The order a user writes imports in must not crash the process on any backend."""

import os
import subprocess
import sys

import pytest

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


# Run on JAX and PyTorch, whose users may have no TensorFlow: Keras' TensorFlow backend imports
# TensorFlow itself. Every name in __all__ must resolve, the lazy submodules included, and the
# submodules users import must be part of it.
PUBLIC_API_CHECK = """
import sys

import vit_keras as vk
loaded = 'tensorflow' in sys.modules
missing = [name for name in vk.__all__ if not hasattr(vk, name)]
modules = [name for name in ('data', 'distribute', 'export', 'analysis', 'masked', 'evaluation',
                             'training', 'layers', 'intermediates', 'weights', 'preprocessing')
           if type(getattr(vk, name)).__name__ != 'module' or name not in vk.__all__
           or getattr(vk, name).__name__ != 'vit_keras.' + name or name not in dir(vk)]
print(loaded, missing, modules, vk.data.make_pipeline.__module__)
"""


@backend_independent  # it starts one process per backend itself
def test_import_vit_keras_imports_no_tensorflow_and_every_public_name_resolves():
    processes = {
        backend: subprocess.Popen([sys.executable, "-c", PUBLIC_API_CHECK],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "KERAS_BACKEND": backend})
        for backend in ("jax", "torch")}
    for backend, process in processes.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, (backend, stderr[-2000:])
        assert stdout.split("\n")[-2] == "False [] [] vit_keras.data", (backend, stdout)


@backend_independent
def test_an_unknown_attribute_of_vit_keras_is_an_attribute_error():
    import vit_keras

    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        vit_keras.no_such_name  # noqa: B018
