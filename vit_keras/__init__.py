"""vit_keras: the Vision Transformer of Dosovitskiy et al. (ICLR 2021) for Keras 3."""

import contextlib as _contextlib
import importlib.util as _importlib_util
import sys as _sys

# Triton (torch.compile's compiler, loaded by `import timm` and torchvision through
# torch._dynamo) segfaults when its native library loads after TensorFlow's, and Keras'
# TensorFlow backend loads TensorFlow: loading Triton's library first makes `import vit_keras`
# then `import timm` safe. Nothing to do when TensorFlow is already in (too late) or Triton is
# not installed.
if "tensorflow" not in _sys.modules and _importlib_util.find_spec("triton") is not None:
    with _contextlib.suppress(ImportError):
        import triton._C.libtriton  # noqa: F401

from vit_keras import intermediates, layers, resnet, training  # they register .keras classes
from vit_keras.configs import VARIANTS, ViTConfig, get_config
from vit_keras.intermediates import features
from vit_keras.lora import lora, merge_lora
from vit_keras.models import vit
from vit_keras.preprocessing import preprocess
from vit_keras.weights import (
    LoadReport,
    load_keras_hub,
    load_npz,
    load_pytorch_weights,
    load_weights,
    save_npz,
    save_weights,
)

__all__ = ["VARIANTS", "LoadReport", "ViTConfig", "features", "get_config", "intermediates",
           "layers", "load_keras_hub", "load_npz", "load_pytorch_weights", "load_weights",
           "lora", "merge_lora", "preprocess", "resnet", "save_npz", "save_weights", "training",
           "vit"]
__version__ = "0.1.0"
