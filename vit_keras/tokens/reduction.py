"""The rules that shrink a block's tokens, one record per kind, and the layers that apply them.

Each rule runs after a block's attention residual and before its MLP, on tokens whose prefix
(class, distillation, register tokens) stays in front and untouched. Every token carries a size,
the count of patches it stands for (1 at the start), so that the read-out and the next blocks
can weigh it. Everything is written with gathers and one-hot matrix products over static
shapes, which every backend, TFLite and ONNX run alike.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
from keras import ops

from vit_keras.layers import TransformerBlock

__all__ = ["REDUCTIONS", "ReducedBlock", "SizeWeightedPooling", "is_reduced"]

_register = keras.saving.register_keras_serializable(package="vit_keras")

# Below any cosine similarity: the score of a pair that must never merge (a prefix token).
NEVER = -10.0


def merge_count(tokens: int, prefix: int, r: int) -> int:
    """ToMe's r for a block of that many tokens: at most half of the mergeable tokens."""
    return max(min(r, (tokens - prefix) // 2), 0)


def keep_count(tokens: int, prefix: int, keep_rate: float) -> int:
    """EViT's kept tokens: ceil(keep_rate x the non-prefix tokens)."""
    return math.ceil(keep_rate * (tokens - prefix))


def _prefix_mask(tokens: int, prefix: int) -> np.ndarray:
    """(A, B) scores' additive mask: NEVER on the rows and columns of prefix tokens, A being
    the even positions and B the odd ones."""
    positions = np.arange(tokens)
    rows, cols = positions[0::2] < prefix, positions[1::2] < prefix
    return np.where(rows[:, None] | cols[None, :], NEVER, 0.0).astype("float32")


def one_hot(indices, count: int):
    """ops.one_hot in int32, as a comparison: the masks and orders built from it stay exact
    integers in a full-integer TFLite file, whose int8 ONE_HOT and float arithmetic would
    round them (and whose int8 ONE_HOT writes its off value unquantized)."""
    indices = ops.cast(indices, "int32")
    return ops.cast(ops.equal(indices[..., None], ops.arange(count, dtype="int32")), "int32")


def bipartite_merge(x, sizes, keys, r: int, prefix: int):
    """ToMe's bipartite soft matching (Bolya et al. 2023): A (even positions) and B (odd),
    compared by the cosine similarity of their keys averaged over heads; the r A tokens with
    the most similar B token are merged into it by a size-weighted average.

    Args:
        x: the tokens (batch, tokens, D), prefix first.
        sizes: their sizes (batch, tokens, 1), int32: counts kept as integers, which a
            full-integer TFLite file would otherwise round.
        keys: the block's keys (batch, tokens, heads, D_h).
        r: the tokens to merge away, at most merge_count.
        prefix: the prefix tokens, never merged.

    Returns:
        (tokens, sizes) with r fewer tokens: the prefix, the unmerged A tokens, then B, each in
        its order.
    """
    tokens = x.shape[1]
    metric = ops.mean(ops.cast(keys, "float32"), axis=2)
    metric = metric / ops.norm(metric, axis=-1, keepdims=True)
    scores = ops.einsum("bic,bjc->bij", metric[:, 0::2], metric[:, 1::2])
    scores = scores + ops.convert_to_tensor(_prefix_mask(tokens, prefix))
    # Each A token's best score and B token in one top_k: Keras' argmax of floats on
    # TensorFlow checks the sign bit with a bitwise op that TFLite's builtins lack.
    best, targets = ops.top_k(scores, 1)
    targets = targets[..., 0]                                               # (batch, A)
    _, merged = ops.top_k(best[..., 0], r)
    a_count, b_count = (tokens + 1) // 2, tokens // 2
    kept = 1 - ops.sum(one_hot(merged, a_count), axis=1)                    # (batch, A)
    transfer = (1 - kept)[..., None] * one_hot(targets, b_count)            # (batch, A, B)
    order = (ops.cumsum(kept, axis=1) - 1) * kept
    placement = kept[..., None] * one_hot(order, a_count - r)               # (batch, A, A-r)

    # Sizes in int32 by gathers and one integer sum: the kept A tokens' positions in order
    # (the largest kept x (A - position)), and each B token's size plus those merged into it.
    a_sizes, b_sizes = sizes[:, 0::2], sizes[:, 1::2]
    _, kept_positions = ops.top_k(kept * (a_count - ops.arange(a_count, dtype="int32")),
                                  a_count - r)
    b_totals = b_sizes + integer_product(transfer, a_sizes)
    # Each token's share of the token it ends in (its size over that token's): a weighted
    # mean of shares in [0, 1] keeps a full-integer file's ranges those of the tokens, where
    # a sum of tokens times sizes, divided after, would quantize the tokens of size 1 coarsely.
    a_totals = (kept[..., None] * a_sizes + (1 - kept)[..., None]
                * ops.take_along_axis(b_totals, targets[..., None], axis=1))

    def share(part, totals):
        return ops.cast(part, "float32") / ops.cast(totals, "float32")

    def assemble(values, unmerged, b):
        """The prefix of values, then the unmerged A tokens and the B tokens after it."""
        parts = [values[:, :prefix], unmerged[:, (prefix + 1) // 2:], b[:, prefix // 2:]]
        # No empty piece (no prefix): LiteRT's XNNPACK delegate fails on zero-size tensors.
        return ops.concatenate([part for part in parts if part.shape[1]], axis=1)

    values = ops.cast(x, "float32")
    a = values[:, 0::2] * share(a_sizes, a_totals)
    b = values[:, 1::2] * share(b_sizes, b_totals)
    merged_x = assemble(values, float_product(placement, a), b + float_product(transfer, a))
    return (ops.cast(merged_x, x.dtype),
            assemble(sizes, ops.take_along_axis(a_sizes, kept_positions[..., None], axis=1),
                     b_totals))


def float_product(weights, values):
    """sum_i weights[b, i, k] values[b, i, c]: a matrix product in float32."""
    return ops.einsum("bik,bic->bkc", ops.cast(weights, "float32"), values)


def integer_product(weights, values):
    """float_product of int32 weights and values as a sum of products, which stays in int32
    in TFLite (whose batch matrix product has no int32 kernel)."""
    return ops.sum(weights[..., None] * values[:, :, None], axis=1)


def class_attention_prune(x, sizes, probabilities, keep: int, prefix: int):
    """EViT's token reorganisation (Liang et al. 2022): the keep non-prefix tokens the class
    token attends to most (averaged over heads) stay, in that order; the rest are fused into
    one token, their sum weighted by that attention, appended last.

    Args:
        x: the tokens (batch, tokens, D), the class token first.
        sizes: their sizes (batch, tokens, 1), int32.
        probabilities: the block's attention (batch, heads, tokens, tokens).
        keep: the non-prefix tokens kept.
        prefix: the prefix tokens, always kept.

    Returns:
        (tokens, sizes) with prefix + keep + 1 tokens; the fused token's size is the sum of
        those it fused.
    """
    attention = ops.mean(ops.cast(probabilities[:, :, 0, prefix:], "float32"), axis=1)
    _, chosen = ops.top_k(attention, keep)
    dropped = 1 - ops.sum(one_hot(chosen, x.shape[1] - prefix), axis=1)    # (batch, N)

    def reorganise(values, fused):
        kept = ops.take_along_axis(values[:, prefix:], chosen[..., None], axis=1)
        return ops.concatenate([values[:, :prefix], kept, fused], axis=1)

    weights = attention * ops.cast(dropped, "float32")
    fused = ops.einsum("bn,bnc->bc", weights, ops.cast(x[:, prefix:], "float32"))[:, None]
    return (reorganise(x, ops.cast(fused, x.dtype)),
            reorganise(sizes, integer_product(dropped[..., None], sizes[:, prefix:])))


@dataclasses.dataclass(frozen=True)
class Reduction:
    """A kind of token reduction: the function that builds it, the suffix of its model's
    name, what it needs from the attention (keys or probabilities), whether later blocks
    weigh each key by its token's size (proportional attention) and a "gap" read-out weighs
    tokens so, and how many tokens it leaves."""

    function: str
    suffix: str
    needs: str
    size_weighted: bool
    count: object
    apply: object


REDUCTIONS = {
    "merge": Reduction(
        function="vk.merge_tokens", suffix="merged", needs="keys",
        size_weighted=True,
        count=lambda tokens, prefix, r: tokens - merge_count(tokens, prefix, r),
        apply=lambda x, sizes, keys, tokens, prefix, r: bipartite_merge(
            x, sizes, keys, merge_count(tokens, prefix, r), prefix)),
    "prune": Reduction(
        function="vk.prune_tokens", suffix="pruned", needs="probabilities",
        size_weighted=False,
        count=lambda tokens, prefix, rate: min(tokens, prefix + keep_count(tokens, prefix,
                                                                           rate) + 1),
        apply=lambda x, sizes, probs, tokens, prefix, rate: class_attention_prune(
            x, sizes, probs, keep_count(tokens, prefix, rate), prefix)),
}


def _check_kind(kind: str) -> Reduction:
    if kind not in REDUCTIONS:
        raise ValueError(f"unknown token reduction {kind!r}: expected one of "
                         f"{', '.join(REDUCTIONS)}")
    return REDUCTIONS[kind]


@_register
class ReducedBlock(keras.layers.Wrapper):
    """A TransformerBlock that reduces its tokens between its attention residual and its MLP
    by one of REDUCTIONS, carrying each token's size (int32): call(tokens, sizes) -> (tokens,
    sizes); sizes None means all ones; normed is the block's first LayerNorm of the tokens
    where it is known (vit_keras.export.ClassTokenFolded), as in TransformerBlock. The
    block's weights are its own (shared with the model it came from); stochastic depth and
    dropout apply in training as in the block, remat does not.

    Args:
        layer: the TransformerBlock.
        kind: a key of REDUCTIONS ("merge", "prune").
        amount: ToMe's r (tokens merged away) or EViT's keep rate for this block; 0 and 1.0
            reduce nothing.
        num_prefix_tokens: the class, distillation and register tokens in front, never
            reduced.
        **kwargs: a Keras layer's arguments (name).

    Raises:
        ValueError: an unknown kind, or a layer that is no TransformerBlock.
    """

    def __init__(self, layer, kind: str, amount, num_prefix_tokens: int, **kwargs):
        if not isinstance(layer, TransformerBlock):
            raise ValueError(f"ReducedBlock wraps a TransformerBlock, got "
                             f"{type(layer).__name__}")
        super().__init__(layer, **kwargs)
        self.reduction = _check_kind(kind)
        self.kind = kind
        self.amount = amount
        self.num_prefix_tokens = num_prefix_tokens

    def build(self, tokens_shape, sizes_shape=None):
        if not self.layer.built:
            self.layer.build(tokens_shape)
        self.built = True

    def tokens_after(self, tokens: int) -> int:
        """The tokens this block outputs for that many in."""
        return self.reduction.count(tokens, self.num_prefix_tokens, self.amount)

    def call(self, tokens, sizes=None, training=None, normed=None):
        block, count = self.layer, tokens.shape[1]
        # Sizes are counted in int32, which mixed precision leaves alone (a bfloat16 count is
        # exact only to 256) and a full-integer TFLite file does not round.
        sizes = (ops.ones_like(tokens[..., :1], dtype="int32") if sizes is None
                 else ops.cast(sizes, "int32"))
        key_bias = (ops.log(ops.cast(sizes[..., 0], "float32"))
                    if self.reduction.size_weighted else None)
        reduces = self.tokens_after(count) < count
        needs = {"return_keys": reduces and self.reduction.needs == "keys",
                 "return_attention_scores": reduces and self.reduction.needs == "probabilities"}
        scales = block.residual_scales(tokens, training)
        x, *extras = block.attention_residual(tokens, scales, training, normed=normed,
                                              key_bias=key_bias, **needs)
        if reduces:
            x, sizes = self.reduction.apply(x, sizes, extras[0], count,
                                            self.num_prefix_tokens, self.amount)
        return block.mlp_residual(x, scales, training), sizes

    def compute_output_spec(self, tokens, sizes=None, training=None, normed=None):
        batch, count, width = tokens.shape
        after = self.tokens_after(count)
        return (keras.KerasTensor((batch, after, width), dtype=self.compute_dtype),
                keras.KerasTensor((batch, after, 1), dtype="int32"))

    def get_config(self):
        return {**super().get_config(), "kind": self.kind, "amount": self.amount,
                "num_prefix_tokens": self.num_prefix_tokens}


@_register
class SizeWeightedPooling(keras.layers.Layer):
    """The "gap" read-out of merged tokens: the mean of the patch tokens, each weighted by its
    size, so that it equals the mean over the patches they stand for (ToMe); the prefix tokens
    are left out.

    Args:
        num_prefix_tokens: the tokens before the patches.
        **kwargs: a Keras layer's arguments (name, dtype).
    """

    def __init__(self, num_prefix_tokens: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = num_prefix_tokens

    def call(self, tokens, sizes):
        weights = ops.cast(sizes[:, self.num_prefix_tokens:], tokens.dtype)
        total = ops.sum(tokens[:, self.num_prefix_tokens:] * weights, axis=1)
        return total / ops.sum(weights, axis=1)

    def compute_output_shape(self, tokens_shape, sizes_shape):
        return (tokens_shape[0], tokens_shape[2])

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens}


def reduced_blocks(model: keras.Model) -> list[ReducedBlock]:
    """The ReducedBlocks of a model, in order (none for a model without a token budget)."""
    return [layer for layer in model.layers if isinstance(layer, ReducedBlock)]


def is_reduced(model: keras.Model) -> bool:
    """Whether a model merges or prunes tokens (vk.merge_tokens, vk.prune_tokens)."""
    return bool(reduced_blocks(model))
