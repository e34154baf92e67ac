"""ViT's building blocks as serializable Keras layers, written with keras.ops (and, on
PyTorch, one torch.addmm: dense_on_tokens).

Weight names and shapes follow the official checkpoint tree (vit_jax models_vit.py), so
loading an official .npz file is a name map, never a reshape.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

LAYER_NORM_EPSILON = 1e-6  # Flax's default; Keras' 1e-3 breaks parity with the checkpoints.
POSEMB_KINDS = ("learned", "sincos2d", "learned2d", "none")

_register = keras.saving.register_keras_serializable(package="vit_keras")


def layer_norm(name: str) -> keras.layers.LayerNormalization:
    return keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=name)


def as_pair(value, what: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"{what} must be a positive int or (height, width), got {value!r}")
    return pair


@_register
class PatchEmbedding(keras.layers.Layer):
    """Cuts images into patch_size x patch_size patches and projects each one (the paper's E).

    One strided convolution, kernel (P, P, C, D) as in the official checkpoints; the output is
    the flattened grid of patch tokens, (batch, grid_h * grid_w, D).
    """

    def __init__(self, patch_size: int, hidden_size: int, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.hidden_size = hidden_size

    def grid_size(self, image_size) -> tuple[int, int]:
        height, width = as_pair(image_size, "image_size")
        for side in (height, width):
            if side % self.patch_size:
                raise ValueError(
                    f"image_size {side} is not divisible by patch size {self.patch_size} "
                    f"(image is {height}x{width})"
                )
        return height // self.patch_size, width // self.patch_size

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                "PatchEmbedding expects images of rank 4 (batch, height, width, channels), "
                f"got shape {tuple(input_shape)}"
            )
        _, height, width, channels = input_shape
        self._grid = self.grid_size((height, width))
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.patch_size, self.patch_size, channels, self.hidden_size),
            initializer="lecun_normal",
        )
        self.bias = self.add_weight(name="bias", shape=(self.hidden_size,), initializer="zeros")

    def call(self, images):
        x = ops.conv(images, self.kernel, strides=self.patch_size, padding="valid")
        x = x + self.bias
        return ops.reshape(x, (-1, self._grid[0] * self._grid[1], self.hidden_size))

    def compute_output_shape(self, input_shape):
        grid = self.grid_size(tuple(input_shape[1:3]))
        return (input_shape[0], grid[0] * grid[1], self.hidden_size)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size,
                "hidden_size": self.hidden_size}


@_register
class ClassToken(keras.layers.Layer):
    """Prepends the learned class token x_class (zero-initialised) to the patch tokens."""

    def build(self, input_shape):
        self.cls = self.add_weight(name="cls", shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, tokens):
        cls = ops.cast(self.cls, tokens.dtype)
        cls = ops.broadcast_to(cls, (ops.shape(tokens)[0], 1, ops.shape(tokens)[-1]))
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], tokens, input_shape[2])


def sincos2d_table(grid_size, width: int, temperature: float = 10_000.0) -> np.ndarray:
    """Fixed 2-D sine-cosine embedding of a grid, [sin x, cos x, sin y, cos y] (MoCo v3)."""
    if width % 4:
        raise ValueError(f"sincos2d position embedding needs hidden_size divisible by 4, "
                         f"got {width}")
    height, grid_width = grid_size
    y, x = np.mgrid[:height, :grid_width]
    omega = np.arange(width // 4) / max(width // 4 - 1, 1)
    omega = 1.0 / temperature**omega
    y = np.einsum("m,d->md", y.flatten(), omega)
    x = np.einsum("m,d->md", x.flatten(), omega)
    table = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    return table.astype("float32")


@_register
class AddPositionEmbedding(keras.layers.Layer):
    """Adds position embeddings E_pos to the token sequence.

    kind: "learned" (1-D, one vector per token, class token included, as the official code),
    "learned2d" (the paper's 2-D ablation: a row and a column embedding of D/2 each,
    concatenated; prefix tokens get a learned vector of their own), "sincos2d" (fixed,
    big_vision; prefix tokens get zeros) or "none".
    """

    def __init__(self, grid_size, num_prefix_tokens: int = 1, kind: str = "learned", **kwargs):
        super().__init__(**kwargs)
        if kind not in POSEMB_KINDS:
            raise ValueError(f"unknown position embedding {kind!r}: expected one of "
                             f"{', '.join(POSEMB_KINDS)}")
        self.grid_size = as_pair(grid_size, "grid_size")
        self.num_prefix_tokens = num_prefix_tokens
        self.kind = kind

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        if input_shape[1] is not None and input_shape[1] != self.num_tokens:
            raise ValueError(
                f"AddPositionEmbedding expects {self.num_tokens} tokens "
                f"({self.num_prefix_tokens} prefix + {self.grid_size[0]}x{self.grid_size[1]} "
                f"grid), got {input_shape[1]}"
            )
        width = input_shape[-1]
        init = keras.initializers.RandomNormal(stddev=0.02)
        if self.kind == "learned":
            self.pos_embedding = self.add_weight(
                name="pos_embedding", shape=(1, self.num_tokens, width), initializer=init)
        elif self.kind == "learned2d":
            if width % 2:
                raise ValueError(f"learned2d position embedding needs an even hidden_size, "
                                 f"got {width}")
            self.row_embedding = self.add_weight(
                name="row_embedding", shape=(self.grid_size[0], width // 2), initializer=init)
            self.col_embedding = self.add_weight(
                name="col_embedding", shape=(self.grid_size[1], width // 2), initializer=init)
            if self.num_prefix_tokens:
                self.prefix_embedding = self.add_weight(
                    name="prefix_embedding", shape=(self.num_prefix_tokens, width),
                    initializer=init)
        elif self.kind == "sincos2d":
            grid = sincos2d_table(self.grid_size, width)
            prefix = np.zeros((self.num_prefix_tokens, width), "float32")
            self._table = np.concatenate([prefix, grid])[None]

    def embedding(self):
        """The (1, tokens, D) table that call() adds; None for kind "none"."""
        if self.kind == "learned":
            return self.pos_embedding
        if self.kind == "sincos2d":
            return ops.convert_to_tensor(self._table)
        if self.kind == "learned2d":
            rows, cols = self.grid_size
            row = ops.repeat(self.row_embedding[:, None, :], cols, axis=1)
            col = ops.repeat(self.col_embedding[None, :, :], rows, axis=0)
            grid = ops.reshape(ops.concatenate([row, col], axis=-1), (rows * cols, -1))
            if self.num_prefix_tokens:
                grid = ops.concatenate([self.prefix_embedding, grid], axis=0)
            return grid[None]
        return None

    def call(self, tokens):
        table = self.embedding()
        if table is None:
            return tokens
        return tokens + ops.cast(table, tokens.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens, "kind": self.kind}


def fused_attention_is_faster() -> bool:
    """Whether ops.dot_product_attention beats einsum-softmax-einsum on the tokens' head-major
    layout: on PyTorch (its scaled_dot_product_attention kernel) and on JAX's accelerators
    (cuDNN). On TensorFlow Keras' op is itself an einsum in token-major layout, and on JAX's
    CPU so is jax.nn.dot_product_attention; XLA's CPU backend ran that 1.7x slower than the
    head-major einsum (a probe of Ti/16's attention at batch 32: 19-25 against 11 ms)."""
    if keras.backend.backend() == "torch":
        return True
    if keras.backend.backend() == "jax":
        import jax

        return jax.default_backend() != "cpu"
    return False


def dense_on_tokens(x, kernel, bias):
    """x @ kernel + bias with the tokens flattened into one (batch * tokens, D) matrix: XLA's CPU
    backend runs the bias and activation fused after a dot 1.6x faster on 2-D shapes than on
    (batch, tokens, D) ones, and on the other backends the reshapes are free views. PyTorch
    eager runs every op as it comes, so there one addmm adds the bias inside the matmul, as
    torch.nn.Linear does, instead of in a pass of its own over the product."""
    flat = ops.reshape(x, (-1, ops.shape(x)[-1]))
    if keras.backend.backend() == "torch":
        import torch

        flat = torch.addmm(ops.convert_to_tensor(bias), flat, ops.convert_to_tensor(kernel))
    else:
        flat = ops.matmul(flat, kernel) + bias
    return ops.reshape(flat, (*ops.shape(x)[:-1], ops.shape(kernel)[-1]))


def dropout_if_active(dropout: keras.layers.Dropout, x, training):
    """dropout(x) only when it can drop something: in inference and at rate 0 it returns x,
    but the Keras layer call alone costs PyTorch eager about 0.2 ms (a probe: 150-210 us
    against a tensor op's few), several times per block."""
    return dropout(x, training=training) if training and dropout.rate else x


@_register
class MultiHeadDotProductAttention(keras.layers.Layer):
    """Self-attention softmax(q k^T / sqrt(D_h)) v with the official parameter shapes.

    query/key/value kernels (D, heads, D_h), output kernel (heads, D_h, D), the layout of the
    checkpoints and of keras.layers.MultiHeadAttention, each applied as one (D, heads * D_h)
    matrix. Without attention dropout and without a request for the probabilities, the fused
    ops.dot_product_attention is taken where it is the faster kernel
    (fused_attention_is_faster); otherwise, and for the probabilities, einsum-softmax-einsum
    over (batch, heads, tokens, D_h).
    """

    def __init__(self, num_heads: int, dropout_rate: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.dropout_rate = dropout_rate
        self.dropout = keras.layers.Dropout(dropout_rate)

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"num_heads {self.num_heads} does not divide hidden_size {width}")
        head_dim = width // self.num_heads
        # Xavier-uniform over the flattened (D, heads*D_h) matrices, as Flax's DenseGeneral:
        # fan_in + fan_out = 2D for all four kernels.
        kernel_init = keras.initializers.RandomUniform(-math.sqrt(3 / width), math.sqrt(3 / width))
        for name in ("query", "key", "value"):
            setattr(self, f"{name}_kernel", self.add_weight(
                name=f"{name}_kernel", shape=(width, self.num_heads, head_dim),
                initializer=kernel_init))
            setattr(self, f"{name}_bias", self.add_weight(
                name=f"{name}_bias", shape=(self.num_heads, head_dim), initializer="zeros"))
        self.out_kernel = self.add_weight(
            name="out_kernel", shape=(self.num_heads, head_dim, width), initializer=kernel_init)
        self.out_bias = self.add_weight(name="out_bias", shape=(width,), initializer="zeros")

    def _project(self, x, name):
        """(batch, tokens, heads, D_h)."""
        kernel, bias = getattr(self, f"{name}_kernel"), getattr(self, f"{name}_bias")
        width, heads, head_dim = kernel.shape
        projected = dense_on_tokens(x, ops.reshape(kernel, (width, heads * head_dim)),
                                    ops.reshape(bias, (heads * head_dim,)))
        return ops.reshape(projected, (*ops.shape(x)[:-1], heads, head_dim))

    def _attend_by_einsum(self, query, key, value, training):
        """Attended values (batch, tokens, heads, D_h) and the probabilities (batch, heads,
        tokens, tokens); the query is scaled before its dot with the keys, as Flax does."""
        query, key, value = (ops.transpose(t, (0, 2, 1, 3)) for t in (query, key, value))
        query = query / ops.cast(math.sqrt(ops.shape(query)[-1]), query.dtype)
        logits = ops.einsum("bhqk,bhtk->bhqt", query, key)
        probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), value.dtype)
        attended = ops.einsum("bhqt,bhtk->bhqk", dropout_if_active(self.dropout, probs, training),
                              value)
        return ops.transpose(attended, (0, 2, 1, 3)), probs

    def call(self, x, training=None, return_attention_scores=False):
        query, key, value = (self._project(x, name) for name in ("query", "key", "value"))
        use_dropout = bool(training) and self.dropout_rate > 0
        if return_attention_scores or use_dropout or not fused_attention_is_faster():
            attended, probs = self._attend_by_einsum(query, key, value, training)
        else:
            attended, probs = ops.dot_product_attention(query, key, value), None
        heads, head_dim, width = self.out_kernel.shape
        out = dense_on_tokens(ops.reshape(attended, (*ops.shape(x)[:-1], heads * head_dim)),
                              ops.reshape(self.out_kernel, (heads * head_dim, width)),
                              self.out_bias)
        return (out, probs) if return_attention_scores else out

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads,
                "dropout_rate": self.dropout_rate}


def computes_tanh_gelu(approximate: bool, compute_dtype: str) -> bool:
    """Whether the MLP computes the tanh GELU: when asked for it (the official checkpoints'),
    except in bfloat16, where the exact GELU stands in for it. The two differ by at most
    4.7e-4 (at x = 2.7), less than bfloat16 rounds any value above 1/8 by, and the stand-in
    moves a model's logits far less than bfloat16 itself does (a test checks). PyTorch's and
    TensorFlow's CPU kernels compute the exact one faster: a probe of Ti/16's MLP activation
    at batch 32 in bfloat16 read 1.07 against 4.76 ms on PyTorch, 18 against 31 ms on
    TensorFlow; XLA (JAX) runs both alike."""
    return approximate and compute_dtype != "bfloat16"


def gelu(x, approximate: bool):
    """ops.gelu(x, approximate), except the exact GELU on TensorFlow: there it is written out
    as 0.5 x (1 + erf(x / sqrt 2)) in float32 and cast back. Grappler fuses tf.nn.gelu into
    the matmul before it (oneDNN's post-op), and that fused kernel is slow, in bfloat16 most:
    a probe of Ti/16's first MLP layer at batch 32 read 56-58 ms in bfloat16 against 18-19
    for this form (float32: 25-31 against 20-24). XLA and the other backends fuse or kernel
    both forms alike, and PyTorch's bfloat16 GELU kernel is fast, so they keep ops.gelu."""
    if approximate or keras.backend.backend() != "tensorflow":
        return ops.gelu(x, approximate=approximate)
    x32 = ops.cast(x, "float32")
    return ops.cast(0.5 * x32 * (1.0 + ops.erf(x32 * (1.0 / math.sqrt(2.0)))), x.dtype)


@_register
class MlpBlock(keras.layers.Layer):
    """Dense(mlp_dim) -> GELU -> dropout -> Dense(D) -> dropout, official initialisers.
    approximate_gelu: the tanh GELU, or the exact one (in bfloat16 always the exact one,
    computes_tanh_gelu says why)."""

    def __init__(self, mlp_dim: int, dropout_rate: float = 0.0, approximate_gelu: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = mlp_dim
        self.dropout_rate = dropout_rate
        self.approximate_gelu = approximate_gelu
        bias_init = keras.initializers.RandomNormal(stddev=1e-6)
        self.dense_0 = keras.layers.Dense(mlp_dim, kernel_initializer="glorot_uniform",
                                          bias_initializer=bias_init, name="Dense_0")
        self.dense_1 = None  # width known at build
        self._bias_init = bias_init
        self.dropout = keras.layers.Dropout(dropout_rate)

    def build(self, input_shape):
        self.dense_0.build(input_shape)
        self.dense_1 = keras.layers.Dense(input_shape[-1], kernel_initializer="glorot_uniform",
                                          bias_initializer=self._bias_init, name="Dense_1")
        self.dense_1.build((*input_shape[:-1], self.mlp_dim))

    @staticmethod
    def _dense(layer, flat):
        """layer(flat) as dense_on_tokens computes it; a layer that Keras has quantized
        (model.quantize) is called, its own call computing with the quantized kernel."""
        if layer.quantization_mode:
            return layer(flat)
        return dense_on_tokens(flat, layer.kernel, layer.bias)

    def call(self, x, training=None):
        """On the tokens flattened to (batch * tokens, D), as dense_on_tokens says why."""
        flat = ops.reshape(x, (-1, ops.shape(x)[-1]))
        flat = gelu(self._dense(self.dense_0, flat), computes_tanh_gelu(
            self.approximate_gelu, self.compute_dtype))
        flat = dropout_if_active(self.dropout, flat, training)
        flat = dropout_if_active(self.dropout, self._dense(self.dense_1, flat), training)
        return ops.reshape(flat, ops.shape(x))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "mlp_dim": self.mlp_dim,
                "dropout_rate": self.dropout_rate, "approximate_gelu": self.approximate_gelu}


@_register
class TransformerBlock(keras.layers.Layer):
    """One pre-norm encoder block of the paper:

        z' = MSA(LN(z)) + z,    z_out = MLP(LN(z')) + z'

    with dropout after attention and inside the MLP, and stochastic depth (drop_path_rate)
    on both residual branches. call(..., return_attention_scores=True) also returns the
    attention probabilities (batch, heads, tokens, tokens), from the same weights.
    normed: LN(z) when the caller has it already (export folds the class token's row, which
    does not depend on the image, into a constant).
    """

    def __init__(self, num_heads: int, mlp_dim: int, dropout_rate: float = 0.0,
                 attention_dropout_rate: float = 0.0, drop_path_rate: float = 0.0,
                 approximate_gelu: bool = True, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.dropout_rate = dropout_rate
        self.attention_dropout_rate = attention_dropout_rate
        self.drop_path_rate = drop_path_rate
        self.approximate_gelu = approximate_gelu
        self.seed = seed
        self.norm_0 = layer_norm("LayerNorm_0")
        self.attention = MultiHeadDotProductAttention(
            num_heads, attention_dropout_rate, name="MultiHeadDotProductAttention_1")
        self.norm_2 = layer_norm("LayerNorm_2")
        self.mlp = MlpBlock(mlp_dim, dropout_rate, approximate_gelu, name="MlpBlock_3")
        self.dropout = keras.layers.Dropout(dropout_rate)
        self.seed_generator = keras.random.SeedGenerator(seed) if drop_path_rate else None

    def build(self, input_shape):
        for layer in (self.norm_0, self.attention, self.norm_2, self.mlp):
            layer.build(input_shape)

    def _drop_path(self, branch, training):
        if not training or not self.drop_path_rate:
            return branch
        keep = 1.0 - self.drop_path_rate
        noise = keras.random.uniform((ops.shape(branch)[0], 1, 1), seed=self.seed_generator)
        return branch * ops.cast(noise < keep, branch.dtype) / keep

    def _normalize(self, norm, x):
        """norm(x) as LayerNormalization.call computes it, without the cost of a layer call
        (dropout_if_active says what it is)."""
        return ops.cast(ops.layer_normalization(x, norm.gamma, norm.beta, epsilon=norm.epsilon),
                        self.compute_dtype)

    def call(self, x, training=None, return_attention_scores=False, normed=None):
        normed = self._normalize(self.norm_0, x) if normed is None else normed
        y = self.attention(normed, training=training,
                           return_attention_scores=return_attention_scores)
        if return_attention_scores:
            y, scores = y
        x = x + self._drop_path(dropout_if_active(self.dropout, y, training), training)
        x = x + self._drop_path(self.mlp(self._normalize(self.norm_2, x), training=training),
                                training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "drop_path_rate": self.drop_path_rate,
                "approximate_gelu": self.approximate_gelu, "seed": self.seed}


@_register
class TokenPooling(keras.layers.Layer):
    """The classifier's read-out: token 0 ("token") or the mean over all tokens ("gap")."""

    def __init__(self, method: str = "token", **kwargs):
        super().__init__(**kwargs)
        if method not in ("token", "gap"):
            raise ValueError(f"unknown classifier {method!r}: expected 'token' or 'gap'")
        self.method = method

    def call(self, tokens):
        return tokens[:, 0] if self.method == "token" else ops.mean(tokens, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def get_config(self):
        return {**super().get_config(), "method": self.method}
