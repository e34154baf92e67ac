"""The official input convention, backend-neutral: uint8 pixels -> float32 in [-1, 1]."""

from keras import ops


def preprocess(images):
    """(x - 127.5) / 127.5, as vit_jax's input pipeline; works on NumPy and backend tensors."""
    return (ops.cast(images, "float32") - 127.5) / 127.5
