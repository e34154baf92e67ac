"""ViT's building blocks as serializable Keras layers: the paper's equations in keras.ops and
Keras layers. Backend-specific kernel choices live in vit_keras.kernels.

Weight names and shapes follow the official checkpoint tree (vit_jax models_vit.py), so
loading an official .npz file is a name map, never a reshape.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from vit_keras import compat, kernels
from vit_keras.configs import as_pair
from vit_keras.position_embeddings import (
    POSITION_EMBEDDINGS,
    AddPositionEmbedding,
    check_position_embedding,
    image_grid,
    offset_grid,
)

__all__ = ["AddPositionEmbedding", "ClassToken", "LayerScale", "MlpBlock",
           "MultiHeadDotProductAttention", "PatchDropout", "PatchEmbedding", "PrefixTokens",
           "TokenPooling", "TransformerBlock", "layer_norm"]

LAYER_NORM_EPSILON = 1e-6  # Flax's default; Keras' 1e-3 breaks parity with the checkpoints.

_register = keras.saving.register_keras_serializable(package="vit_keras")


def layer_norm(name: str, epsilon: float = LAYER_NORM_EPSILON) -> keras.layers.LayerNormalization:
    """A LayerNormalization with Flax's epsilon, 1e-6 by default: Keras' own 1e-3 would break
    parity with the official checkpoints.

    Args:
        name: the layer's name (its scope in the checkpoint tree).
        epsilon: added to the variance.

    Returns:
        The keras.layers.LayerNormalization.
    """
    return keras.layers.LayerNormalization(epsilon=epsilon, name=name)


def quick_gelu(x):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP was trained with."""
    return x * ops.sigmoid(1.702 * x)


# The MLP's nonlinearity by name: f(x, approximate_gelu).
MLP_ACTIVATIONS = {
    "gelu": lambda x, approximate: ops.gelu(x, approximate=approximate),
    "quick_gelu": lambda x, approximate: quick_gelu(x),
}


def check_mlp_activation(name: str) -> str:
    if name not in MLP_ACTIVATIONS:
        raise ValueError(f"unknown mlp_activation {name!r}: expected one of "
                         f"{', '.join(MLP_ACTIVATIONS)}")
    return name


class SavesSublayers:
    """For layers that make Keras sub-layers in build(): their configs go into get_config as
    "sublayers", and a layer made from that config builds each from its saved config, the
    layer's own arguments (equation, shapes, initialisers) taking precedence: what the saved
    config adds is what model.quantize and enable_lora changed (an int8 or float8 dtype
    policy, a LoRA rank), so a quantized or LoRA model saved as .keras loads back as it was."""

    SUBLAYERS: tuple[str, ...] = ()

    def _init_sublayers(self, sublayers: dict | None) -> None:
        self._saved_sublayers = dict(sublayers or {})

    def _sublayer(self, cls, name: str, **kwargs):
        saved = self._saved_sublayers.get(name)
        return cls.from_config({**saved, **kwargs}) if saved else cls(name=name, **kwargs)

    def sublayer_configs(self) -> dict:
        if not self.built:
            return self._saved_sublayers
        return {name: getattr(self, attr).get_config() for attr, name in self.SUBLAYERS}


def no_quantization(layer_class):
    """model.quantize leaves this layer as it is (no dense kernel), without a warning."""

    def quantize(self, mode=None, type_check=True, config=None):
        pass

    layer_class.quantize = quantize
    return layer_class


def plain_dense(layer) -> bool:
    """Whether a Dense or EinsumDense layer's call is x times its kernel plus its bias: not
    once enable_lora or model.quantize has changed it."""
    return not layer.lora_enabled and not layer.quantization_mode


def dropout_if_active(dropout: keras.layers.Dropout, x, training):
    """dropout(x) only where it can drop something: in training, at a rate above 0. A layer
    call that returns its input still costs eager backends a layer call."""
    return dropout(x, training=training) if training and dropout.rate else x


@_register
@no_quantization
class PatchEmbedding(keras.layers.Layer):
    """Cuts images into patch_size x patch_size patches and projects each one (the paper's E).

    One strided convolution, kernel (P, P, C, D) as in the official checkpoints; the output is
    the flattened grid of patch tokens, (batch, grid_h * grid_w, D), for images of the size it
    was built for, or of any size when built with height and width None.

    Args:
        patch_size: the side P of a square patch, in pixels.
        hidden_size: the token width D.
        use_bias: add a bias to each token (CLIP's embedding has none).
        **kwargs: a Keras layer's arguments (name, dtype, trainable).

    Raises:
        ValueError: images of another rank, a size the patches do not divide, or another
            number of channels than the layer was built for.
    """

    def __init__(self, patch_size: int, hidden_size: int, use_bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.hidden_size = hidden_size
        self.use_bias = use_bias

    def grid_size(self, image_size) -> tuple[int, int]:
        """The grid of patches an image of this size is cut into.

        Args:
            image_size: an int or (height, width) in pixels.

        Returns:
            (rows, columns) of patches.

        Raises:
            ValueError: a side the patch size does not divide.
        """
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
        if height is not None and width is not None:
            self.grid_size((height, width))  # refuses sizes the patches do not divide
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.patch_size, self.patch_size, channels, self.hidden_size),
            initializer="lecun_normal",
        )
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.hidden_size,),
                                        initializer="zeros")

    def call(self, images):
        self._check_channels(images.shape)
        return kernels.patch_embedding(images, self)

    def _check_channels(self, shape) -> None:
        """Refuses images whose channels the kernel was not built for, in one line: Keras'
        model input check lets a single channel through (it squeezes a last axis of 1), and
        the convolution's own error comes wrapped in stack traces of each enclosing call."""
        expected = self.kernel.shape[2]
        if shape[-1] is None or shape[-1] == expected:
            return
        error = ValueError(
            f"expected images with {expected} channels, got {shape[-1]} (images of shape "
            f"{tuple(shape)}): convert the images (grayscale to RGB: np.repeat(images, 3, "
            f"axis=-1)) or build the model with channels={shape[-1]}")
        raise compat.without_call_info(error)

    def compute_output_shape(self, input_shape):
        if None in input_shape[1:3]:
            return (input_shape[0], None, self.hidden_size)
        grid = self.grid_size(tuple(input_shape[1:3]))
        return (input_shape[0], grid[0] * grid[1], self.hidden_size)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size,
                "hidden_size": self.hidden_size, "use_bias": self.use_bias}


@_register
@no_quantization
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


@_register
@no_quantization
class PrefixTokens(keras.layers.Layer):
    """Inserts num_tokens learned tokens after the first `after` tokens: DeiT's distillation
    token (after the class token) or register tokens (Darcet et al. 2024, after the class
    token and any distillation token). Random-normal initialised, so that several tokens
    start apart.

    Args:
        num_tokens: how many tokens to insert.
        after: how many tokens come before them.
        stddev: the standard deviation of their initial values.
        **kwargs: a Keras layer's arguments (name, dtype, trainable).
    """

    def __init__(self, num_tokens: int, after: int = 1, stddev: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.num_tokens = num_tokens
        self.after = after
        self.stddev = stddev

    def build(self, input_shape):
        self.tokens = self.add_weight(
            name="tokens", shape=(1, self.num_tokens, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=self.stddev))

    def call(self, tokens):
        new = ops.cast(self.tokens, tokens.dtype)
        new = ops.broadcast_to(new, (ops.shape(tokens)[0], self.num_tokens,
                                     ops.shape(tokens)[-1]))
        return ops.concatenate([tokens[:, :self.after], new, tokens[:, self.after:]], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + self.num_tokens
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        return {**super().get_config(), "num_tokens": self.num_tokens, "after": self.after,
                "stddev": self.stddev}


@_register
@no_quantization
class PatchDropout(keras.layers.Layer):
    """In training, keeps a random int(N * (1 - rate)) of each image's N patch tokens and the
    num_prefix_tokens before them (PatchDropout, Liu et al. 2023; timm's patch_drop_rate):
    a step then costs about that share of a full one, and the random subsets augment the
    data. At inference it passes every token through, and so does a frozen layer
    (trainable=False: a frozen backbone's features keep their grid, as a frozen
    BatchNormalization keeps to inference).

    Args:
        rate: the share of patch tokens to leave out, in [0, 1).
        num_prefix_tokens: the tokens before the patches, always kept.
        seed: the random seed of the kept subsets; None draws one.
        **kwargs: a Keras layer's arguments (name, dtype, trainable).

    Raises:
        ValueError: a rate outside [0, 1).
    """

    def __init__(self, rate: float, num_prefix_tokens: int = 0, seed: int | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"patch_drop_rate must be in [0, 1), got {rate!r}")
        self.rate = rate
        self.num_prefix_tokens = num_prefix_tokens
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, tokens, training=False):
        if not training or not self.rate or not self.trainable:
            return tokens
        prefix, patches = tokens[:, :self.num_prefix_tokens], tokens[:, self.num_prefix_tokens:]
        count = ops.shape(patches)[1]
        if isinstance(count, int):
            keep = max(1, int(count * (1.0 - self.rate)))
        else:  # a dynamic grid in a TensorFlow graph
            kept_share = ops.cast(count, "float32") * (1.0 - self.rate)
            keep = ops.maximum(ops.cast(kept_share, "int32"), 1)
        noise = keras.random.uniform(ops.shape(patches)[:2], seed=self.seed_generator)
        kept = ops.argsort(noise, axis=-1)[:, :keep]
        patches = ops.take_along_axis(patches, ops.expand_dims(kept, -1), axis=1)
        return ops.concatenate([prefix, patches], axis=1)

    def get_config(self):
        return {**super().get_config(), "rate": self.rate,
                "num_prefix_tokens": self.num_prefix_tokens, "seed": self.seed}


@_register
class MultiHeadDotProductAttention(SavesSublayers, keras.layers.Layer):
    """Self-attention softmax(q k^T / sqrt(D_h)) v with the official parameter shapes.

    query / key / value are EinsumDense layers with kernels (D, heads, D_h) and biases
    (heads, D_h), out has kernel (heads, D_h, D): the checkpoints' layout, and Keras layers
    that model.quantize and enable_lora reach. Like MlpBlock's, they see the tokens as one
    (batch * tokens, ...) matrix (docs/performance.md). attention_kernel: how the attention
    itself is computed (vit_keras.kernels.ATTENTION_KERNELS). qkv_bias=False leaves out the
    biases of query, key and value (timm's qkv_bias=False); out keeps its bias.
    qk_norm: a LayerNorm over each head's query and key before their product (Dehghani et al.
    2023; timm's qk_norm), with norm_epsilon. proj_bias=False: out without bias.
    position_bias: a kind of position embedding that biases the logits (biases_attention in
    vit_keras.position_embeddings, "relative"), whose weights this layer then holds, for
    sequences of num_prefix_tokens tokens followed by num_patches patches on a grid_size grid
    (another grid, given to call(..., grid=...), read by the kind's rule).

    Args:
        num_heads: the attention heads; they divide the token width.
        dropout_rate: dropout on the attention probabilities, in training.
        attention_kernel: how the attention itself is computed, one of
            vit_keras.kernels.ATTENTION_KERNELS ("auto", "fused", "einsum").
        qkv_bias: False leaves out the biases of query, key and value (timm's
            qkv_bias=False); out keeps its bias unless proj_bias is False.
        qk_norm: a LayerNorm over each head's query and key before their product (Dehghani et
            al. 2023; timm's qk_norm).
        norm_epsilon: the epsilon of the qk_norm LayerNorms.
        proj_bias: False builds out without a bias.
        position_bias: a kind of position embedding that biases the logits ("relative"),
            whose weights this layer then holds; None for none.
        num_patches: the patches position_bias's weights are built for.
        num_prefix_tokens: the tokens before the patches, which position_bias treats apart.
        grid_size: the (rows, columns) of the num_patches patches; None infers a square grid
            (layers saved before it was recorded: one of another count keeps its grid).
        sublayers: the sub-layers' configs saved by get_config, so that a quantized or LoRA
            layer loads back as it was; None builds them afresh.
        **kwargs: a Keras layer's arguments (name, dtype, trainable).

    Raises:
        ValueError: an unknown attention kernel, a position_bias that is not a kind that
            biases attention or comes without num_patches, a grid_size of another count, or
            num_heads not dividing the token width.
    """

    SUBLAYERS = (("query", "query"), ("key", "key"), ("value", "value"), ("out", "out"))

    def __init__(self, num_heads: int, dropout_rate: float = 0.0,
                 attention_kernel: str = "auto", qkv_bias: bool = True, qk_norm: bool = False,
                 norm_epsilon: float = LAYER_NORM_EPSILON, proj_bias: bool = True,
                 position_bias: str | None = None, num_patches: int | None = None,
                 num_prefix_tokens: int = 0, grid_size=None, sublayers: dict | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.position_bias = check_position_bias(position_bias, num_patches)
        self.num_patches = num_patches
        self.grid_size = offset_grid(num_patches, grid_size) if self.position_bias else None
        self.num_prefix_tokens = num_prefix_tokens
        self.num_heads = num_heads
        self.dropout_rate = dropout_rate
        self.qkv_bias = qkv_bias
        self.proj_bias = proj_bias
        self.qk_norm = qk_norm
        self.norm_epsilon = norm_epsilon
        self.qk_norms = ([layer_norm(name, norm_epsilon) for name in ("query_norm", "key_norm")]
                         if qk_norm else [])
        self.attention_kernel = kernels.check_attention_kernel(attention_kernel)
        self.dropout = keras.layers.Dropout(dropout_rate)
        self._init_sublayers(sublayers)

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"num_heads {self.num_heads} does not divide hidden_size {width}")
        head_dim = self.head_dim = width // self.num_heads
        # Xavier-uniform over the flattened (D, heads*D_h) matrices, as Flax's DenseGeneral:
        # fan_in + fan_out = 2D for all four kernels.
        limit = math.sqrt(3 / width)

        def projection(equation, output_shape, bias_axes, name):
            return self._sublayer(
                keras.layers.EinsumDense, name, equation=equation, output_shape=output_shape,
                bias_axes=bias_axes,
                kernel_initializer=keras.initializers.RandomUniform(-limit, limit))

        self.query, self.key, self.value = (
            projection("nd,dhk->nhk", (self.num_heads, head_dim),
                       "hk" if self.qkv_bias else None, name)
            for name in ("query", "key", "value"))
        self.out = projection("nhk,hkd->nd", (width,), "d" if self.proj_bias else None, "out")
        for layer in (self.query, self.key, self.value):
            layer.build((None, width))
        self.out.build((None, self.num_heads, head_dim))
        for norm in self.qk_norms:
            norm.build((None, None, self.num_heads, head_dim))
        if self.position_bias:
            POSITION_EMBEDDINGS[self.position_bias].build_attention(self)

    def logit_bias(self, query, grid=None, key_bias=None):
        """What is added to the attention logits: position_bias's, and key_bias.

        Args:
            query: the queries (batch, tokens, heads, D_h).
            grid: the (rows, columns) of the patches; None for grid_size.
            key_bias: a (batch, tokens) bias for each key, the same for every query and head
                (token merging's proportional attention, log of each token's size); None
                for none.

        Returns:
            The bias, (batch, heads, tokens, tokens) or broadcastable to it, or None for
            none.
        """
        bias = None
        if self.position_bias:
            bias = POSITION_EMBEDDINGS[self.position_bias].attention_bias(self, query, grid)
        if key_bias is None:
            return bias
        key_bias = key_bias[:, None, None, :]
        return key_bias if bias is None else bias + key_bias

    def takes_direct_path(self, training=None, return_attention_scores=False) -> bool:
        """Whether call() computes the projections from their variables (vit_keras.kernels
        .dense) instead of through their Keras calls, which cost an eager backend many times
        the arithmetic of a small model: where the fast path "direct_layers" runs
        (kernels.uses). The general path serves what the direct one cannot: the
        probabilities, attention dropout in training, qk_norm, and projections that LoRA or
        quantization changed.

        Args:
            training: whether the call is in training.
            return_attention_scores: whether the call returns the probabilities.

        Returns:
            True where the direct path serves the call.
        """
        return (kernels.uses("direct_layers") and not return_attention_scores
                and not self.qk_norms
                and not (training and self.dropout_rate)
                and all(map(plain_dense, (self.query, self.key, self.value, self.out))))

    def direct(self, x, grid=None, key_bias=None, return_keys=False):
        """call(x) on the direct path (takes_direct_path).

        Args:
            x: the tokens (batch, tokens, D).
            grid: the (rows, columns) of the patches; None for grid_size.
            key_bias: see logit_bias.
            return_keys: also return the keys (batch, tokens, heads, D_h).

        Returns:
            The layer's output for x, and the keys with return_keys.
        """
        query, key, value = (kernels.dense(x, layer) for layer in (self.query, self.key,
                                                                    self.value))
        heads = (*ops.shape(query)[:2], self.num_heads, self.head_dim)
        bias = None
        if self.position_bias or key_bias is not None:
            bias = self.logit_bias(ops.reshape(query, heads), grid, key_bias)
        attended = kernels.multi_head_attention(query, key, value, self.num_heads,
                                                self.attention_kernel, bias=bias)
        out = kernels.dense(attended, self.out)
        return (out, ops.reshape(key, heads)) if return_keys else out

    def call(self, x, training=None, return_attention_scores=False, grid=None, key_bias=None,
             return_keys=False):
        if self.takes_direct_path(training, return_attention_scores):
            return self.direct(x, grid, key_bias, return_keys)
        batch, tokens, width = ops.shape(x)
        heads = (batch, tokens, self.num_heads, self.head_dim)
        flat = ops.reshape(x, (-1, width))
        query, key, value = (ops.reshape(layer(flat), heads)
                             for layer in (self.query, self.key, self.value))
        if self.qk_norms:
            query, key = (norm(t) for norm, t in zip(self.qk_norms, (query, key), strict=True))
        active = bool(training) and self.dropout_rate > 0
        attended, probs = kernels.attention(
            query, key, value, self.attention_kernel,
            dropout=self.dropout if active else None, training=training,
            return_probabilities=return_attention_scores,
            bias=self.logit_bias(query, grid, key_bias))
        attended = ops.reshape(attended, (-1, self.num_heads, self.head_dim))
        out = ops.reshape(self.out(attended), (batch, tokens, width))
        extras = (probs,) * return_attention_scores + (key,) * return_keys
        return (out, *extras) if extras else out

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads,
                "dropout_rate": self.dropout_rate,
                "attention_kernel": self.attention_kernel, "qkv_bias": self.qkv_bias,
                "qk_norm": self.qk_norm, "norm_epsilon": self.norm_epsilon,
                "proj_bias": self.proj_bias, "position_bias": self.position_bias,
                "num_patches": self.num_patches, "num_prefix_tokens": self.num_prefix_tokens,
                "grid_size": self.grid_size, "sublayers": self.sublayer_configs()}


def check_position_bias(kind: str | None, num_patches: int | None) -> str | None:
    """kind, if it is a position embedding that biases the attention logits (or None), with
    the count of patches its weights need."""
    if kind is None:
        return None
    if not POSITION_EMBEDDINGS[check_position_embedding(kind)].biases_attention:
        biasing = [name for name, record in POSITION_EMBEDDINGS.items()
                   if record.biases_attention]
        raise ValueError(f"position embedding {kind!r} adds a table to the tokens, not a bias "
                         f"to the attention logits: expected one of {', '.join(biasing)}")
    if not isinstance(num_patches, int) or num_patches < 1:
        raise ValueError(f"position_bias={kind!r} needs num_patches, the patches its offsets "
                         f"are learned for (a positive int), got {num_patches!r}")
    return kind


@_register
class MlpBlock(SavesSublayers, keras.layers.Layer):
    """Dense(mlp_dim) -> GELU -> dropout -> Dense(D) -> dropout, with the official
    initialisers. The Dense layers see the tokens as one (batch * tokens, D) matrix, the
    shape every backend's matrix multiply takes directly.

    Args:
        mlp_dim: the hidden width.
        dropout_rate: dropout after each Dense layer, in training.
        approximate_gelu: the tanh GELU of the official checkpoints; False is the exact erf
            GELU of timm and Hugging Face.
        activation: a name in MLP_ACTIVATIONS: "gelu", or "quick_gelu" (OpenAI's CLIP).
        use_bias: False builds both Dense layers without biases.
        sublayers: the sub-layers' configs saved by get_config, so that a quantized or LoRA
            layer loads back as it was; None builds them afresh.
        **kwargs: a Keras layer's arguments (name, dtype, trainable).

    Raises:
        ValueError: an unknown activation.
    """

    SUBLAYERS = (("dense_0", "Dense_0"), ("dense_1", "Dense_1"))

    def __init__(self, mlp_dim: int, dropout_rate: float = 0.0, approximate_gelu: bool = True,
                 activation: str = "gelu", use_bias: bool = True, sublayers: dict | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = mlp_dim
        self.dropout_rate = dropout_rate
        self.approximate_gelu = approximate_gelu
        self.activation = check_mlp_activation(activation)
        self.use_bias = use_bias
        self.dropout = keras.layers.Dropout(dropout_rate)
        self._init_sublayers(sublayers)

    def build(self, input_shape):
        def dense(units, name):
            return self._sublayer(keras.layers.Dense, name, units=units, use_bias=self.use_bias,
                                  kernel_initializer="glorot_uniform",
                                  bias_initializer=keras.initializers.RandomNormal(stddev=1e-6))

        self.dense_0 = dense(self.mlp_dim, "Dense_0")
        self.dense_1 = dense(input_shape[-1], "Dense_1")
        self.dense_0.build((None, input_shape[-1]))
        self.dense_1.build((None, self.mlp_dim))

    def takes_direct_path(self, training=None) -> bool:
        """Whether call() computes the Dense layers from their variables, as attention's
        direct path (kernels.uses("direct_layers")): not with dropout in training, LoRA or
        quantized kernels.

        Args:
            training: whether the call is in training.

        Returns:
            True where the direct path serves the call.
        """
        return (kernels.uses("direct_layers") and not (training and self.dropout_rate)
                and plain_dense(self.dense_0) and plain_dense(self.dense_1))

    def direct(self, x):
        """call(x) on the direct path (takes_direct_path).

        Args:
            x: the tokens (batch, tokens, D).

        Returns:
            The layer's output for x.
        """
        hidden = MLP_ACTIVATIONS[self.activation](kernels.dense(x, self.dense_0),
                                                  self.approximate_gelu)
        return kernels.dense(hidden, self.dense_1)

    def call(self, x, training=None):
        if self.takes_direct_path(training):
            return self.direct(x)
        flat = ops.reshape(x, (-1, ops.shape(x)[-1]))
        flat = MLP_ACTIVATIONS[self.activation](self.dense_0(flat), self.approximate_gelu)
        flat = dropout_if_active(self.dropout, flat, training)
        flat = dropout_if_active(self.dropout, self.dense_1(flat), training)
        return ops.reshape(flat, ops.shape(x))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "mlp_dim": self.mlp_dim,
                "dropout_rate": self.dropout_rate, "approximate_gelu": self.approximate_gelu,
                "activation": self.activation, "use_bias": self.use_bias,
                "sublayers": self.sublayer_configs()}


@_register
@no_quantization
class LayerScale(keras.layers.Layer):
    """x * gamma, a learned per-channel scale of a residual branch (Touvron et al., "Going
    deeper with image transformers", 2021; DeiT III and DINOv2 use it).

    Args:
        init_value: gamma's initial value, on every channel.
        **kwargs: a Keras layer's arguments (name, dtype, trainable).
    """

    def __init__(self, init_value: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.init_value = init_value

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],),
                                     initializer=keras.initializers.Constant(self.init_value))

    def call(self, x):
        return x * ops.cast(self.scale, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}


@_register
class TransformerBlock(keras.layers.Layer):
    """One pre-norm encoder block of the paper:

        z' = MSA(LN(z)) + z,    z_out = MLP(LN(z')) + z'

    with dropout after attention and inside the MLP, and stochastic depth (drop_path_rate)
    on both residual branches. call(..., return_attention_scores=True) also returns the
    attention probabilities (batch, heads, tokens, tokens), from the same weights.
    normed: LN(z) when the caller has it already (export folds the class token's row, which
    does not depend on the image, into a constant). images: the images of a model that takes
    any size, whose grid of stride-pixel cells a position_bias reads (None: grid_size).
    remat: in training, keep only the block's input and recompute the rest in the backward
    pass (keras.remat), trading compute for activation memory. Stochastic depth draws its
    masks outside the recomputed part; dropout inside it would draw new ones, so remat
    requires dropout_rate and attention_dropout_rate 0.

    Args:
        num_heads: the attention heads.
        mlp_dim: the MLP's hidden width.
        dropout_rate: dropout after attention and inside the MLP, in training.
        attention_dropout_rate: dropout on the attention probabilities, in training.
        drop_path_rate: the stochastic depth rate of both residual branches.
        approximate_gelu: the tanh GELU of the official checkpoints; False is the exact erf
            GELU.
        attention_kernel: "auto", "fused" or "einsum" (vit_keras.kernels).
        remat: keep only the block's input in training and recompute the rest in the
            backward pass.
        seed: the random seed of stochastic depth's masks; None draws one.
        layer_scale: LayerScale's initial value on both branches, z' = ls(MSA(LN(z))) + z;
            None (the paper's block) for none.
        qkv_bias: see MultiHeadDotProductAttention.
        qk_norm: see MultiHeadDotProductAttention.
        mlp_activation: see MlpBlock.
        norm_epsilon: every LayerNorm's epsilon (CLIP's are 1e-5).
        proj_bias: False builds attention's output projection and the MLP without biases
            (timm's proj_bias).
        position_bias: see MultiHeadDotProductAttention (relative position embeddings).
        num_patches: see MultiHeadDotProductAttention.
        num_prefix_tokens: see MultiHeadDotProductAttention.
        grid_size: see MultiHeadDotProductAttention.
        stride: pixels per grid cell, for call(..., images=...).
        sublayers: the attention's and MLP's saved sub-layer configs, from get_config;
            None builds them afresh.
        **kwargs: a Keras layer's arguments (name, dtype, trainable).

    Raises:
        ValueError: remat with a dropout rate above 0, or an option its sub-layers refuse.
    """

    def __init__(self, num_heads: int, mlp_dim: int, dropout_rate: float = 0.0,
                 attention_dropout_rate: float = 0.0, drop_path_rate: float = 0.0,
                 approximate_gelu: bool = True, attention_kernel: str = "auto",
                 remat: bool = False, seed: int | None = None, layer_scale: float | None = None,
                 qkv_bias: bool = True, qk_norm: bool = False, mlp_activation: str = "gelu",
                 norm_epsilon: float = LAYER_NORM_EPSILON, proj_bias: bool = True,
                 position_bias: str | None = None, num_patches: int | None = None,
                 num_prefix_tokens: int = 0, grid_size=None, stride: int | None = None,
                 sublayers: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        if remat and (dropout_rate or attention_dropout_rate):
            raise ValueError(
                "remat recomputes the block in the backward pass, where dropout would draw "
                f"other masks: it needs dropout_rate 0 and attention_dropout_rate 0, got "
                f"{dropout_rate} and {attention_dropout_rate} (stochastic depth is fine)")
        self.remat = remat
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.dropout_rate = dropout_rate
        self.attention_dropout_rate = attention_dropout_rate
        self.drop_path_rate = drop_path_rate
        self.approximate_gelu = approximate_gelu
        self.attention_kernel = attention_kernel
        self.seed = seed
        self.layer_scale = layer_scale
        self.qkv_bias = qkv_bias
        self.qk_norm = qk_norm
        self.mlp_activation = mlp_activation
        self.norm_epsilon = norm_epsilon
        self.proj_bias = proj_bias
        self.position_bias = position_bias
        self.num_patches = num_patches
        self.num_prefix_tokens = num_prefix_tokens
        self.stride = stride
        self.norm_0 = layer_norm("LayerNorm_0", norm_epsilon)
        sublayers = sublayers or {}
        self.attention = MultiHeadDotProductAttention(
            num_heads, attention_dropout_rate, attention_kernel, qkv_bias, qk_norm,
            norm_epsilon, proj_bias, position_bias, num_patches, num_prefix_tokens, grid_size,
            sublayers=sublayers.get("MultiHeadDotProductAttention_1"),
            name="MultiHeadDotProductAttention_1")
        self.branch_scales = [LayerScale(layer_scale, name=f"LayerScale_{i}")
                              for i in range(2)] if layer_scale is not None else []
        self.norm_2 = layer_norm("LayerNorm_2", norm_epsilon)
        self.mlp = MlpBlock(mlp_dim, dropout_rate, approximate_gelu, mlp_activation, proj_bias,
                            sublayers=sublayers.get("MlpBlock_3"), name="MlpBlock_3")
        self.dropout = keras.layers.Dropout(dropout_rate)
        self.seed_generator = keras.random.SeedGenerator(seed) if drop_path_rate else None

    def build(self, input_shape):
        for layer in (self.norm_0, self.attention, self.norm_2, self.mlp, *self.branch_scales):
            layer.build(input_shape)

    def _drop_path_scale(self, x, training):
        """Per-sample scale of a residual branch: 0 or 1/keep in training, None when off."""
        if not training or not self.drop_path_rate:
            return None
        keep = 1.0 - self.drop_path_rate
        noise = keras.random.uniform((ops.shape(x)[0], 1, 1), seed=self.seed_generator)
        return ops.cast(noise < keep, x.dtype) / keep

    def call(self, x, training=None, return_attention_scores=False, normed=None, images=None):
        if images is not None and self.stride is None:
            raise ValueError(f"{self.name} needs its stride (pixels per grid cell) to read the "
                             f"grid of images")
        grid = None if images is None else image_grid(images, self.stride)
        scales = self.residual_scales(x, training)
        if self.remat and training and not return_attention_scores and normed is None:
            ones = ops.ones_like(x[:, :1, :1])
            scales = [ones if scale is None else scale for scale in scales]
            return keras.remat(lambda x, *s: self._forward(x, s, training, grid=grid))(
                x, *scales)
        return self._forward(x, scales, training, return_attention_scores, normed, grid)

    def _forward(self, x, scales, training, return_attention_scores=False, normed=None,
                 grid=None):
        """The block's equations. Its sublayers run on their direct paths where they can
        (MultiHeadDotProductAttention.takes_direct_path, kernels.layer_norm), the LayerScales'
        call without Keras' layer call around it."""
        x, *scores = self.attention_residual(x, scales, training, return_attention_scores,
                                             normed, grid)
        x = self.mlp_residual(x, scales, training)
        return (x, *scores) if return_attention_scores else x

    def residual_scales(self, x, training) -> list:
        """The per-sample stochastic-depth scales of the two residual branches (None: off)."""
        return [self._drop_path_scale(x, training) for _ in range(2)]

    def attention_residual(self, x, scales, training, return_attention_scores=False,
                           normed=None, grid=None, key_bias=None, return_keys=False):
        """z' = MSA(LN(z)) + z, the block's first half (token reduction runs between the
        halves): (z', probabilities with return_attention_scores, keys with return_keys).

        Args:
            x: the tokens z (batch, tokens, D).
            scales: residual_scales(x, training).
            training: whether the call is in training.
            return_attention_scores: also return the attention probabilities.
            normed: LN(z) when the caller has it; None computes it.
            grid: the (rows, columns) of the patches a position_bias reads.
            key_bias: a (batch, tokens) bias on each key's logits
                (MultiHeadDotProductAttention.logit_bias).
            return_keys: also return the keys (batch, tokens, heads, D_h).

        Returns:
            A tuple: z', then the probabilities and the keys where asked for.
        """
        normed = kernels.layer_norm(x, self.norm_0) if normed is None else normed
        if self.attention.takes_direct_path(training, return_attention_scores):
            y = self.attention.direct(normed, grid, key_bias, return_keys)
        else:
            y = self.attention(normed, training=training,
                               return_attention_scores=return_attention_scores, grid=grid,
                               key_bias=key_bias, return_keys=return_keys)
        y, *extras = y if return_attention_scores or return_keys else (y,)
        x = x + self._residual(dropout_if_active(self.dropout, y, training), scales, 0)
        return (x, *extras)

    def mlp_residual(self, x, scales, training):
        """z_out = MLP(LN(z')) + z', the block's second half."""
        normed = kernels.layer_norm(x, self.norm_2)
        mlp = (self.mlp.direct(normed) if self.mlp.takes_direct_path(training)
               else self.mlp(normed, training=training))
        return x + self._residual(mlp, scales, 1)

    def _residual(self, branch, scales, index):
        """A residual branch through its LayerScale and stochastic-depth scale."""
        if self.branch_scales:
            branch = self.branch_scales[index].call(branch)
        return branch if scales[index] is None else branch * scales[index]

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "mlp_dim": self.mlp_dim,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "drop_path_rate": self.drop_path_rate,
                "approximate_gelu": self.approximate_gelu,
                "attention_kernel": self.attention_kernel, "remat": self.remat,
                "seed": self.seed, "layer_scale": self.layer_scale, "qkv_bias": self.qkv_bias,
                "qk_norm": self.qk_norm, "mlp_activation": self.mlp_activation,
                "norm_epsilon": self.norm_epsilon, "proj_bias": self.proj_bias,
                "position_bias": self.position_bias, "num_patches": self.num_patches,
                "num_prefix_tokens": self.num_prefix_tokens,
                "grid_size": self.attention.grid_size, "stride": self.stride,
                "sublayers": {"MultiHeadDotProductAttention_1": self.attention.sublayer_configs(),
                              "MlpBlock_3": self.mlp.sublayer_configs()}}


@_register
@no_quantization
class TokenPooling(keras.layers.Layer):
    """The classifier's read-out: the prefix token at index `token` ("token": 0 is the class
    token, 1 DeiT's distillation token; "mean" of both is DeiT's feature), or the mean over
    the patch tokens ("gap"), leaving out the num_prefix_tokens before them as timm does.

    Args:
        method: "token" or "gap".
        num_prefix_tokens: the tokens before the patches, which "gap" leaves out.
        token: the index of the token "token" reads, or "mean" for the mean of the first
            two (DeiT's class and distillation tokens).
        **kwargs: a Keras layer's arguments (name, dtype, trainable).

    Raises:
        ValueError: an unknown method.
    """

    METHODS = ("token", "gap")

    def __init__(self, method: str = "token", num_prefix_tokens: int = 0,
                 token: int | str = 0, **kwargs):
        super().__init__(**kwargs)
        if method not in self.METHODS:
            raise ValueError(f"unknown classifier {method!r}: expected one of "
                             f"{', '.join(self.METHODS)}")
        self.method = method
        self.num_prefix_tokens = num_prefix_tokens
        self.token = token

    def call(self, tokens):
        if self.method == "gap":
            return ops.mean(tokens[:, self.num_prefix_tokens:], axis=1)
        if self.token == "mean":
            return ops.mean(tokens[:, :2], axis=1)
        return tokens[:, self.token]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])

    def get_config(self):
        return {**super().get_config(), "method": self.method,
                "num_prefix_tokens": self.num_prefix_tokens, "token": self.token}
