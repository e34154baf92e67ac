"""vit_keras: the Vision Transformer of Dosovitskiy et al. (ICLR 2021) for Keras 3."""

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
