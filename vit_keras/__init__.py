"""vit_keras: the Vision Transformer of Dosovitskiy et al. (ICLR 2021) for Keras 3."""

import importlib as _importlib

# compat first, before Keras loads TensorFlow: it loads Triton's library, which segfaults when
# it loads after TensorFlow's (import timm, torchvision). layers, intermediates, resnet and
# training register the .keras classes they define.
from vit_keras import (
    compat,  # first, for its effect
    distillation,
    distribute,
    intermediates,
    layers,
    preprocessing,
    resnet,
    training,
    weights,
)
from vit_keras.configs import VARIANTS, ViTConfig, get_config
from vit_keras.intermediates import features
from vit_keras.lora import lora, merge_lora
from vit_keras.models import vit
from vit_keras.preprocessing import InputConvention, input_convention, preprocess
from vit_keras.tokens.budget import merge_tokens, prune_tokens
from vit_keras.weights import (
    LoadReport,
    load_keras_hub,
    load_model,
    load_npz,
    load_pytorch_weights,
    load_weights,
    save_npz,
    save_weights,
)
from vit_keras.weights.labels import decode_predictions

compat.check_at_import()

# The public submodules are in __all__ beside the functions and classes. Those that import
# TensorFlow when loaded (tf.data pipelines, SavedModel export) or that only some users need
# load on first use (PEP 562), so that `import vit_keras` imports no TensorFlow: PyTorch and
# JAX users have none.
_LAZY_SUBMODULES = ("analysis", "data", "evaluation", "export", "masked")

__all__ = ["VARIANTS", "InputConvention", "LoadReport", "ViTConfig", "analysis", "data",
           "decode_predictions", "distillation", "distribute", "evaluation", "export", "features",
           "get_config", "input_convention", "intermediates", "layers", "load_keras_hub",
           "load_model", "load_npz", "load_pytorch_weights", "load_weights", "lora", "masked",
           "merge_lora", "merge_tokens", "preprocess", "preprocessing", "prune_tokens", "resnet",
           "save_npz", "save_weights", "training", "vit", "weights"]
__version__ = "0.5.1"


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY_SUBMODULES})
