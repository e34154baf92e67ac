"""vit_keras: the Vision Transformer of Dosovitskiy et al. (ICLR 2021) for Keras 3."""

from vit_keras import layers
from vit_keras.checkpoints import load_weights
from vit_keras.configs import VARIANTS, ViTConfig, get_config
from vit_keras.models import vit
from vit_keras.preprocessing import preprocess

__all__ = ["VARIANTS", "ViTConfig", "get_config", "layers", "load_weights", "preprocess", "vit"]
__version__ = "0.1.0"
