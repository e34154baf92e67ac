"""The official input convention: uint8 pixels [0, 255] -> float32 [-1, 1], x / 127.5 - 1."""

import keras

# The layer vit(include_preprocessing=True) puts before the patch embedding.
MODEL_LAYER = "preprocessing"


def unit_range(name: str | None = None, dtype=None) -> keras.layers.Rescaling:
    """The convention as one Keras layer, used by models (export's uint8 serving functions,
    vit(include_preprocessing=True)) and by tf.data pipelines on any backend."""
    return keras.layers.Rescaling(1 / 127.5, offset=-1.0, name=name, dtype=dtype)


def preprocess(images):
    """uint8 images (NumPy or backend tensors) -> float32 in [-1, 1], the model's input."""
    return unit_range()(keras.ops.cast(images, "float32"))


def takes_raw_images(model: keras.Model) -> bool:
    """Whether `model` scales [0, 255] pixels itself (vit(include_preprocessing=True)), so
    that nothing before it may scale them again."""
    return any(layer.name == MODEL_LAYER for layer in model.layers)
