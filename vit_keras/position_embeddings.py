"""Position embeddings E_pos, one record per kind, and the layer that adds them to the tokens.

A kind says which weights it adds to the layer and which (1, tokens, D) table it adds to the
token sequence for a grid of patches: the grid it was built for, or any other when the model
takes images of any size (vit(dynamic_image_size=True)). A kind may instead bias every
attention layer's logits (relative): then its weights live in each attention layer. A new
kind is one more class registered with @position_embedding("name") (docs/contributing.md
shows one), and vit(posemb=...) and the apps accept it from then on.
"""

from __future__ import annotations

import functools
import math

import keras
import numpy as np
from keras import ops

from vit_keras import kernels
from vit_keras.configs import RESAMPLING_METHODS, as_pair

POSITION_EMBEDDINGS: dict[str, PositionEmbedding] = {}


def position_embedding(name: str):
    """Class decorator: registers one kind of position embedding under `name`."""

    def register(cls):
        POSITION_EMBEDDINGS[name] = cls()
        return cls

    return register


class PositionEmbedding:
    """One kind: build() adds its weights to an AddPositionEmbedding layer (its grid_size and
    num_prefix_tokens known), table() returns what is added to the tokens for a grid (ints, or
    tensors inside a graph of unknown image size), or None.

    A kind with biases_attention adds no table; build_attention() adds its weights to each
    attention layer (vit_keras.layers.MultiHeadDotProductAttention, its num_heads, head_dim,
    num_patches and num_prefix_tokens known), and attention_bias() returns what that layer
    adds to its logits before the softmax."""

    biases_attention = False

    def build(self, layer: AddPositionEmbedding, width: int) -> None:
        pass

    def table(self, layer: AddPositionEmbedding, grid):
        return None

    def build_attention(self, attention) -> None:
        pass

    def attention_bias(self, attention, query):
        """query (batch, tokens, heads, D_h) -> (batch, heads, tokens, tokens), or None."""
        return None


def is_built_grid(layer: AddPositionEmbedding, grid) -> bool:
    """Whether grid is known, as ints, to be the one the layer was built for."""
    return all(isinstance(side, int) for side in grid) and tuple(grid) == layer.grid_size


def resampling_matrix(old: int, new, method: str):
    """(new, old) weights of linear interpolation from old positions to new ones: "zoom"
    aligns the corners as scipy.ndimage.zoom(order=1) does (the official algorithm),
    "bilinear" the pixel centres as timm does. The same arithmetic as
    vit_keras.weights.resample.resample_grid, in keras.ops, so that it runs inside a model."""
    positions = ops.cast(ops.arange(new), "float32")
    new = ops.cast(new, "float32")
    if method == "zoom":
        source = positions * ((old - 1) / ops.maximum(new - 1, 1))
    else:
        source = (positions + 0.5) * (old / new) - 0.5
    return interpolation_matrix(source, old)


def interpolation_matrix(source, old: int):
    """(new, old) weights that read old positions at the fractional positions `source`,
    linearly between the two neighbours (clipped to the ends)."""
    source = ops.clip(source, 0, old - 1)
    low = ops.floor(source)
    fraction = (source - low)[:, None]
    low = ops.cast(low, "int32")
    high = ops.minimum(low + 1, old - 1)
    return ops.one_hot(low, old) * (1 - fraction) + ops.one_hot(high, old) * fraction


def resample_axis(table, new, method: str):
    """(old, width) embeddings of one axis -> (new, width)."""
    return ops.matmul(resampling_matrix(table.shape[0], new, method), table)


def _normal_init():
    return keras.initializers.RandomNormal(stddev=0.02)


@position_embedding("learned")
class Learned(PositionEmbedding):
    """One vector per token, the class token's included, as the official code."""

    def build(self, layer, width):
        layer.pos_embedding = layer.add_weight(
            name="pos_embedding", shape=(1, layer.num_tokens, width), initializer=_normal_init())

    def table(self, layer, grid):
        if is_built_grid(layer, grid):
            return layer.pos_embedding
        prefix = layer.num_prefix_tokens
        width = layer.pos_embedding.shape[-1]
        patches = ops.reshape(layer.pos_embedding[0, prefix:], (*layer.grid_size, width))
        rows, cols = (resampling_matrix(old, new, layer.resample)
                      for old, new in zip(layer.grid_size, grid, strict=True))
        patches = ops.einsum("ia,abd,jb->ijd", rows, patches, cols)
        return ops.concatenate([layer.pos_embedding[:, :prefix],
                                ops.reshape(patches, (1, -1, width))], axis=1)


@position_embedding("learned2d")
class Learned2D(PositionEmbedding):
    """The paper's 2-D ablation (Appendix D.4): a row and a column embedding of D/2 each,
    concatenated; prefix tokens get a learned vector of their own."""

    def build(self, layer, width):
        if width % 2:
            raise ValueError(f"learned2d position embedding needs an even hidden_size, "
                             f"got {width}")
        rows, cols = layer.grid_size
        layer.row_embedding = layer.add_weight(
            name="row_embedding", shape=(rows, width // 2), initializer=_normal_init())
        layer.col_embedding = layer.add_weight(
            name="col_embedding", shape=(cols, width // 2), initializer=_normal_init())
        if layer.num_prefix_tokens:
            layer.prefix_embedding = layer.add_weight(
                name="prefix_embedding", shape=(layer.num_prefix_tokens, width),
                initializer=_normal_init())

    def table(self, layer, grid):
        row, col = layer.row_embedding, layer.col_embedding
        if not is_built_grid(layer, grid):
            row = resample_axis(row, grid[0], layer.resample)
            col = resample_axis(col, grid[1], layer.resample)
        shape = (grid[0], grid[1], row.shape[-1])
        table = ops.concatenate([ops.broadcast_to(row[:, None, :], shape),
                                 ops.broadcast_to(col[None, :, :], shape)], axis=-1)
        table = ops.reshape(table, (-1, 2 * row.shape[-1]))
        if layer.num_prefix_tokens:
            table = ops.concatenate([layer.prefix_embedding, table], axis=0)
        return table[None]


def sincos2d_frequencies(width: int, temperature: float = 10_000.0) -> np.ndarray:
    """The D/4 frequencies 1 / T^(i / (D/4 - 1)) of the sine-cosine embedding."""
    if width % 4:
        raise ValueError(f"sincos2d position embedding needs hidden_size divisible by 4, "
                         f"got {width}")
    omega = np.arange(width // 4) / max(width // 4 - 1, 1)
    return 1.0 / temperature**omega


def sincos2d_table(grid_size, width: int) -> np.ndarray:
    """Fixed 2-D sine-cosine embedding of a grid, [sin x, cos x, sin y, cos y] (MoCo v3)."""
    height, grid_width = grid_size
    y, x = np.mgrid[:height, :grid_width]
    omega = sincos2d_frequencies(width)
    y = np.einsum("m,d->md", y.flatten(), omega)
    x = np.einsum("m,d->md", x.flatten(), omega)
    table = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    return table.astype("float32")


def sincos2d_ops(grid, width: int):
    """sincos2d_table for a grid known only when the model runs, in float32."""
    omega = ops.convert_to_tensor(sincos2d_frequencies(width).astype("float32"))
    y, x = ops.meshgrid(ops.arange(grid[0]), ops.arange(grid[1]), indexing="ij")
    y, x = (ops.cast(ops.reshape(axis, (-1, 1)), "float32") * omega for axis in (y, x))
    return ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)], axis=1)


@position_embedding("sincos2d")
class SinCos2D(PositionEmbedding):
    """Fixed sine-cosine embedding of the patch grid (big_vision); prefix tokens get zeros."""

    def build(self, layer, width):
        prefix = np.zeros((layer.num_prefix_tokens, width), "float32")
        table = np.concatenate([prefix, sincos2d_table(layer.grid_size, width)])[None]
        layer.fixed_table = kernels.constant(table)

    def table(self, layer, grid):
        if is_built_grid(layer, grid):
            return ops.convert_to_tensor(layer.fixed_table)
        table = sincos2d_ops(grid, layer.fixed_table.shape[-1])
        prefix = ops.zeros((layer.num_prefix_tokens, layer.fixed_table.shape[-1]))
        return ops.concatenate([prefix, table], axis=0)[None]


@position_embedding("none")
class NoPositionEmbedding(PositionEmbedding):
    """No position information at all (the paper's ablation)."""


# The offsets of pairs with a prefix token (class, distillation, register tokens), which has
# no place in the patch sequence: one learned embedding each, after the 2N - 1 patch offsets.
PREFIX_OFFSETS = ("token->token", "token->patch", "patch->token")


@position_embedding("relative")
class Relative(PositionEmbedding):
    """The paper's 1-D relative attention (Appendix D.4): every offset p_q - p_k between two
    of the N patches of the flattened (row-major) patch sequence has a learned embedding per
    head, (2N - 1, heads, D_h) in each attention layer; the query, scaled by 1/sqrt(D_h) as for
    the content logits, is dotted with the embedding of each key's offset, and that is added
    to the content logits before the softmax. Nothing is added to the tokens.

    Prefix tokens have no position in the sequence: pairs with one share three more learned
    embeddings per layer, PREFIX_OFFSETS (as BEiT's relative position bias treats its class
    token), so every prefix token sees all patches alike and the patches see it alike.

    On another grid than the built H x W one (offset r W + c is r rows and c columns), each
    pair's displacement is read per axis (offset_table), so that a row stays a row and a
    column a column whatever the grid's shape; the attention layer then needs the call's grid
    (attention_bias's `grid`) and the built one (its grid_size).
    """

    biases_attention = True

    def build_attention(self, attention):
        heads = (attention.num_heads, attention.head_dim)
        attention.relative_embedding = attention.add_weight(
            name="relative_embedding", shape=(2 * attention.num_patches - 1, *heads),
            initializer=_normal_init())
        if attention.num_prefix_tokens:
            attention.prefix_relative_embedding = attention.add_weight(
                name="prefix_relative_embedding", shape=(len(PREFIX_OFFSETS), *heads),
                initializer=_normal_init())

    def attention_bias(self, attention, query, grid=None):
        """grid: the (rows, columns) of the call's patches, ints or tensors; None for the
        built grid."""
        tokens, prefix = ops.shape(query)[1], attention.num_prefix_tokens
        table = attention.relative_embedding
        if is_built_offset_grid(attention, tokens - prefix, grid):
            grid = attention.grid_size or (1, attention.num_patches)  # any shape reads q - k
            row_width = grid[1]
        else:
            table = offset_table(table, attention.grid_size, grid)
            row_width = ops.shape(table)[1]
            table = ops.reshape(table, (-1, *table.shape[2:]))
        layout = (*grid, prefix, row_width, ops.shape(table)[0])
        index = (static_relative_index(*layout) if all(isinstance(n, int) for n in layout)
                 else relative_index(grid, prefix, row_width, layout[-1]))
        if prefix:
            table = ops.concatenate([table, attention.prefix_relative_embedding], axis=0)
        query = query / ops.cast(math.sqrt(attention.head_dim), query.dtype)
        logits = ops.einsum("bqhd,ohd->bhqo", query, ops.cast(table, query.dtype))
        batch, heads = ops.shape(logits)[:2]
        bias = ops.take(ops.reshape(logits, (batch, heads, -1)), index, axis=2)
        return ops.reshape(bias, (batch, heads, tokens, tokens))


def offset_grid(num_patches: int, grid_size=None) -> tuple[int, int] | None:
    """The grid a relative table of num_patches patches is built for: grid_size, else (a
    layer saved before grid_size was recorded) the square grid of that count, else None.

    Args:
        num_patches: the patches the table is built for.
        grid_size: their (rows, columns), or None where not recorded.

    Returns:
        (rows, columns), or None for an unrecorded grid that is not square.

    Raises:
        ValueError: a grid_size of another count of patches.
    """
    if grid_size is not None:
        grid = as_pair(grid_size, "grid_size")
        if grid[0] * grid[1] != num_patches:
            raise ValueError(f"grid_size {grid[0]}x{grid[1]} has {grid[0] * grid[1]} patches, "
                             f"not num_patches {num_patches}")
        return grid
    side = math.isqrt(num_patches)
    return (side, side) if side * side == num_patches else None


def is_built_offset_grid(attention, patches, grid) -> bool:
    """Whether the call's patches are on the grid the attention's table is built for (read
    as it is), or on another one (read per axis). A call without its grid must have the
    built count; a change of grid needs the built grid's shape.

    Args:
        attention: the attention layer (its name, num_patches and grid_size).
        patches: the call's patches, an int or a tensor.
        grid: the call's (rows, columns), or None where not given.

    Returns:
        True for the built grid.

    Raises:
        ValueError: another count of patches without their grid, or a change of grid where
            the built grid's shape is unknown.
    """
    built = attention.grid_size
    if grid is not None and all(isinstance(side, int) for side in (*grid, patches)) and (
            grid[0] * grid[1] != patches):
        raise ValueError(f"{attention.name}: a {grid[0]}x{grid[1]} grid has {grid[0] * grid[1]} "
                         f"patches, the call has {patches}")
    if grid is None:
        if isinstance(patches, int) and patches != attention.num_patches:
            raise ValueError(
                f"{attention.name}: relative offsets built for {attention.num_patches} patches "
                f"cannot be read for {patches} patches without their grid (rows, columns): "
                f"call the block with images=, as vk.vit(dynamic_image_size=True) does (a model "
                f"of any size saved before it did cannot: build it again and load the file "
                f"with vk.load_weights)")
        return True
    if all(isinstance(side, int) for side in grid) and tuple(grid) == built:
        return True
    if built is None:
        raise ValueError(
            f"{attention.name}: relative offsets built for {attention.num_patches} patches on "
            f"an unrecorded grid (no grid_size: a file saved before it was recorded, not "
            f"square) cannot be read on a {grid[0]}x{grid[1]} grid: build the model at its "
            f"image size and load the file's weights with vk.load_weights")
    return False


def axis_weights(built: int, new):
    """(2 new - 1, 2 built - 1) weights reading each displacement d of an axis of `new`
    patches at d (built - 1) / (new - 1) on the axis of `built` patches, linearly between its
    two integer neighbours (the ends aligned); an axis of one patch reads displacement 0."""
    displacements = ops.arange(2 * new - 1) - (new - 1)
    scaled = (ops.cast(displacements * (built - 1), "float32")
              / ops.maximum(ops.cast(new, "float32") - 1.0, 1.0))
    return interpolation_matrix(scaled + (built - 1), 2 * built - 1)


def offset_table(table, built, grid):
    """A built (2HW - 1, ...) table of offsets on an H x W grid (offset o at row o + HW - 1),
    read per axis for a grid of H' x W' patches: displacement (dr, dc) is scaled to
    (dr (H - 1) / (H' - 1), dc (W - 1) / (W' - 1)) and read bilinearly at its four integer
    neighbours (r, c), as offset r W + c. The one rule of the model, the loaders
    (vit_keras.weights.resample.resample_offsets) and so of .keras files moved to another
    size.

    Args:
        table: the (2HW - 1, ...) offsets.
        built: (H, W).
        grid: (H', W'): ints, or tensors in a graph of unknown image size.

    Returns:
        (2H' - 1, 2W' - 1, ...): the embedding of displacement (dr, dc) at
        [dr + H' - 1, dc + W' - 1].
    """
    rows, cols = built
    displacement = np.arange(1 - rows, rows)[:, None] * cols + np.arange(1 - cols, cols)
    by_axis = ops.take(table, displacement + rows * cols - 1, axis=0)
    read = ops.einsum("ia,abk,jb->ijk", axis_weights(rows, grid[0]),
                      ops.reshape(by_axis, (2 * rows - 1, 2 * cols - 1, -1)),
                      axis_weights(cols, grid[1]))
    return ops.reshape(read, (*ops.shape(read)[:2], *table.shape[1:]))


def relative_index(grid, prefix: int, row_width, offsets, xp=ops):
    """For each (query, key) pair of tokens (prefix tokens, then the patches of a grid), the
    index of its logit in the query's row of logits over a table's offsets, flattened: patches
    read displacement (dr, dc) at dr row_width + dc + (offsets - 1) / 2 (the built 1-D table:
    row_width the grid's width, offsets 2N - 1; a table of displacements: row_width
    2W' - 1), pairs with a prefix token PREFIX_OFFSETS after the `offsets` patch offsets.
    xp: keras.ops (tensors of a grid known only as the model runs) or numpy."""
    rows, cols = grid
    patches = rows * cols
    tokens = patches + prefix
    row = offsets + (len(PREFIX_OFFSETS) if prefix else 0)
    place = xp.arange(patches)
    place = xp.pad(place // cols * row_width + place % cols, [[prefix, 0]])
    index = place[:, None] - place[None, :] + (offsets - 1) // 2
    if prefix:
        token = xp.arange(tokens) < prefix
        query_token, key_token = token[:, None], token[None, :]
        index = xp.where(query_token, xp.where(key_token, offsets, offsets + 1),
                         xp.where(key_token, offsets + 2, index))
    return xp.reshape(index + xp.arange(tokens)[:, None] * row, (-1,))


@functools.lru_cache(maxsize=64)
def static_relative_index(rows: int, cols: int, prefix: int, row_width: int, offsets: int):
    """relative_index of a grid known when the model is built or traced, made once in NumPy:
    eager backends would otherwise spend a dozen operations on it in every call."""
    index = relative_index((rows, cols), prefix, row_width, offsets, np).astype("int32")
    return kernels.constant(index)


def image_grid(images, stride: int):
    """The grid of tokens of images (batch, height, width, channels) cut into stride-pixel
    cells; tensors where the graph does not know the image size."""
    height, width = ops.shape(images)[1:3]
    if any(isinstance(side, int) and side % stride for side in (height, width)):
        raise ValueError(f"images of {height}x{width} pixels do not divide into the model's "
                         f"{stride}x{stride}-pixel patches: expected multiples of {stride}")
    return height // stride, width // stride


@keras.saving.register_keras_serializable(package="vit_keras")
class AddPositionEmbedding(keras.layers.Layer):
    """Adds position embeddings E_pos of the given kind (POSITION_EMBEDDINGS) to the tokens:
    num_prefix_tokens (the class token) followed by a grid_size grid of patches.

    call(tokens, images=...) fits the table to the images' grid instead (images of
    stride-pixel cells): learned tables resampled by `resample` (RESAMPLING_METHODS),
    sincos2d computed for that grid. At grid_size the table is the built one, unchanged.

    Args:
        grid_size: the grid of patches the table is built for, an int or (rows, columns).
        num_prefix_tokens: the tokens before the patches that take an embedding (the class
            token, DeiT's distillation token).
        kind: a name in POSITION_EMBEDDINGS: "learned", "learned2d", "sincos2d", "none" or
            "relative".
        stride: pixels per grid cell, needed to fit the table to images of another size.
        resample: how a learned table is fitted to another grid, one of
            RESAMPLING_METHODS ("zoom", "bilinear").
        **kwargs: a Keras layer's arguments (name, dtype, trainable).

    Raises:
        ValueError: an unknown kind or resampling method, or tokens of another count than
            the grid's.
    """

    def __init__(self, grid_size, num_prefix_tokens: int = 1, kind: str = "learned",
                 stride: int | None = None, resample: str = "zoom", **kwargs):
        super().__init__(**kwargs)
        check_position_embedding(kind)
        if resample not in RESAMPLING_METHODS:
            raise ValueError(f"unknown resampling method {resample!r}: expected one of "
                             f"{', '.join(RESAMPLING_METHODS)}")
        self.grid_size = as_pair(grid_size, "grid_size")
        self.num_prefix_tokens = num_prefix_tokens
        self.kind = kind
        self.stride = stride
        self.resample = resample

    @property
    def num_tokens(self) -> int:
        """The tokens the layer takes at grid_size: prefix tokens and patches."""
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        if input_shape[1] is not None and input_shape[1] != self.num_tokens:
            raise ValueError(
                f"AddPositionEmbedding expects {self.num_tokens} tokens "
                f"({self.num_prefix_tokens} prefix + {self.grid_size[0]}x{self.grid_size[1]} "
                f"grid), got {input_shape[1]}"
            )
        POSITION_EMBEDDINGS[self.kind].build(self, input_shape[-1])

    def embedding(self, grid=None):
        """The table that call() adds for a grid.

        Args:
            grid: (rows, columns) of patches; None for grid_size.

        Returns:
            The (1, tokens, D) table, or None for a kind that adds nothing to the tokens.
        """
        return POSITION_EMBEDDINGS[self.kind].table(self, grid or self.grid_size)

    def call(self, tokens, images=None):
        if images is not None and self.stride is None:
            raise ValueError("AddPositionEmbedding needs its stride (pixels per grid cell) to "
                             "fit the table to images")
        table = self.embedding(None if images is None else image_grid(images, self.stride))
        if table is None:
            return tokens
        return tokens + ops.cast(table, tokens.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def quantize(self, mode=None, type_check=True, config=None):
        """Nothing to quantize: model.quantize leaves the embedding in float."""

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens, "kind": self.kind,
                "stride": self.stride, "resample": self.resample}


def check_position_embedding(kind: str) -> str:
    if kind not in POSITION_EMBEDDINGS:
        raise ValueError(f"unknown position embedding {kind!r}: expected one of "
                         f"{', '.join(POSITION_EMBEDDINGS)}")
    return kind
