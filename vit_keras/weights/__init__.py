"""Loading and saving weights: one module per source layout (official .npz, PyTorch, keras-hub), a
registry of named releases, position-embedding resampling, and the dispatcher by file name."""

from vit_keras.weights.assign import LoadReport
from vit_keras.weights.files import load_model, load_weights, save_weights
from vit_keras.weights.keras_hub import load_keras_hub
from vit_keras.weights.npz import load_npz, save_npz
from vit_keras.weights.pytorch import load_pytorch_weights

__all__ = ["LoadReport", "load_keras_hub", "load_model", "load_npz",
           "load_pytorch_weights", "load_weights", "save_npz", "save_weights"]
