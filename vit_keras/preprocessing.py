"""The official input convention: uint8 pixels [0, 255] -> float32 [-1, 1], x / 127.5 - 1."""

import keras


def unit_range(name: str | None = None) -> keras.layers.Rescaling:
    """The convention as one Keras layer, used by models (export's uint8 serving functions)
    and by tf.data pipelines on any backend."""
    return keras.layers.Rescaling(1 / 127.5, offset=-1.0, name=name)


def preprocess(images):
    """uint8 images (NumPy or backend tensors) -> float32 in [-1, 1], the model's input."""
    return unit_range()(keras.ops.cast(images, "float32"))
