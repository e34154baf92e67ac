"""Every backend-specific kernel choice of the model, behind one switch each, so that the
layers read as the paper. This is the only module of the model that names a backend.

attention, softmax(q k^T / sqrt(D_h)) v over (batch, tokens, heads, D_h) tensors:
- "einsum": keras.ops einsums in head-major layout, softmax in float32; the only kernel that
  can return the probabilities or apply attention dropout, so those always take it.
- "fused": keras.ops.dot_product_attention, which Keras maps to the backend's fused kernel
  (PyTorch's scaled_dot_product_attention, cuDNN under JAX on GPU).
- "auto": "fused" where the backend has a fused kernel (PyTorch; JAX on an accelerator),
  else "einsum": TensorFlow's and JAX's CPU versions of the fused op are the same einsums in
  a token-major layout (docs/performance.md times both kernels).
"""

from __future__ import annotations

import math

import keras
from keras import ops

ATTENTION_KERNELS = ("auto", "fused", "einsum")


def check_attention_kernel(kernel: str) -> str:
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}: expected one of "
                         f"{', '.join(ATTENTION_KERNELS)}")
    return kernel


def backend_has_fused_attention() -> bool:
    """Whether "auto" picks the fused kernel: on PyTorch, and on JAX with an accelerator."""
    backend = keras.backend.backend()
    if backend == "torch":
        return True
    if backend == "jax":
        import jax

        return jax.default_backend() != "cpu"
    return False


def einsum_attention(query, key, value, dropout=None, training=None):
    """(attended values (batch, tokens, heads, D_h), probabilities (batch, heads, tokens,
    tokens)); the query is scaled before its dot with the keys, as Flax does."""
    query, key, value = (ops.transpose(t, (0, 2, 1, 3)) for t in (query, key, value))
    query = query / ops.cast(math.sqrt(ops.shape(query)[-1]), query.dtype)
    logits = ops.einsum("bhqk,bhtk->bhqt", query, key)
    probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), value.dtype)
    weights = dropout(probs, training=training) if dropout is not None else probs
    attended = ops.einsum("bhqt,bhtk->bhqk", weights, value)
    return ops.transpose(attended, (0, 2, 1, 3)), probs


def attention(query, key, value, kernel: str = "auto", dropout=None, training=None,
              return_probabilities: bool = False):
    """Attended values, and the probabilities (None from the fused kernel). dropout: a Keras
    Dropout layer for the probabilities, or None."""
    use_fused = (kernel == "fused" or (kernel == "auto" and backend_has_fused_attention()))
    if return_probabilities or dropout is not None or not use_fused:
        return einsum_attention(query, key, value, dropout, training)
    return ops.dot_product_attention(query, key, value), None
