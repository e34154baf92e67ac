"""Position embeddings E_pos, one record per kind, and the layer that adds them to the tokens.

A kind says which weights it adds to the layer and which (1, tokens, D) table it adds to the
token sequence; a new kind is one more class registered with @position_embedding("name")
(docs/contributing.md shows one), and vit(posemb=...) and the apps accept it from then on.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from vit_keras.configs import as_pair

POSITION_EMBEDDINGS: dict[str, PositionEmbedding] = {}


def position_embedding(name: str):
    """Class decorator: registers one kind of position embedding under `name`."""

    def register(cls):
        POSITION_EMBEDDINGS[name] = cls()
        return cls

    return register


class PositionEmbedding:
    """One kind: build() adds its weights to an AddPositionEmbedding layer (its grid_size and
    num_prefix_tokens known), table() returns what is added to the tokens, or None."""

    def build(self, layer: AddPositionEmbedding, width: int) -> None:
        pass

    def table(self, layer: AddPositionEmbedding):
        return None


def _normal_init():
    return keras.initializers.RandomNormal(stddev=0.02)


@position_embedding("learned")
class Learned(PositionEmbedding):
    """One vector per token, the class token's included, as the official code."""

    def build(self, layer, width):
        layer.pos_embedding = layer.add_weight(
            name="pos_embedding", shape=(1, layer.num_tokens, width), initializer=_normal_init())

    def table(self, layer):
        return layer.pos_embedding


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

    def table(self, layer):
        rows, cols = layer.grid_size
        row = ops.repeat(layer.row_embedding[:, None, :], cols, axis=1)
        col = ops.repeat(layer.col_embedding[None, :, :], rows, axis=0)
        grid = ops.reshape(ops.concatenate([row, col], axis=-1), (rows * cols, -1))
        if layer.num_prefix_tokens:
            grid = ops.concatenate([layer.prefix_embedding, grid], axis=0)
        return grid[None]


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


@position_embedding("sincos2d")
class SinCos2D(PositionEmbedding):
    """Fixed sine-cosine embedding of the patch grid (big_vision); prefix tokens get zeros."""

    def build(self, layer, width):
        prefix = np.zeros((layer.num_prefix_tokens, width), "float32")
        layer.fixed_table = np.concatenate([prefix, sincos2d_table(layer.grid_size, width)])[None]

    def table(self, layer):
        return ops.convert_to_tensor(layer.fixed_table)


@position_embedding("none")
class NoPositionEmbedding(PositionEmbedding):
    """No position information at all (the paper's ablation)."""


@keras.saving.register_keras_serializable(package="vit_keras")
class AddPositionEmbedding(keras.layers.Layer):
    """Adds position embeddings E_pos of the given kind (POSITION_EMBEDDINGS) to the tokens:
    num_prefix_tokens (the class token) followed by a grid_size grid of patches."""

    def __init__(self, grid_size, num_prefix_tokens: int = 1, kind: str = "learned", **kwargs):
        super().__init__(**kwargs)
        check_position_embedding(kind)
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
        POSITION_EMBEDDINGS[self.kind].build(self, input_shape[-1])

    def embedding(self):
        """The (1, tokens, D) table that call() adds; None for a kind that adds nothing."""
        return POSITION_EMBEDDINGS[self.kind].table(self)

    def call(self, tokens):
        table = self.embedding()
        if table is None:
            return tokens
        return tokens + ops.cast(table, tokens.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def quantize(self, mode=None, type_check=True, config=None):
        """Nothing to quantize: model.quantize leaves the embedding in float."""

    def get_config(self):
        return {**super().get_config(), "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens, "kind": self.kind}


def check_position_embedding(kind: str) -> str:
    if kind not in POSITION_EMBEDDINGS:
        raise ValueError(f"unknown position embedding {kind!r}: expected one of "
                         f"{', '.join(POSITION_EMBEDDINGS)}")
    return kind
