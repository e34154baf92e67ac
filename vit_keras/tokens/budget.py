"""vk.merge_tokens and vk.prune_tokens: a trained ViT with fewer tokens in its later blocks,
as a new functional model that shares its weights, trains with model.fit, saves as .keras and
exports. Neither method changes a weight's shape, so both apply to every checkpoint the
library loads.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras

from vit_keras import configs
from vit_keras.intermediates import (
    block_indices,
    blocks_of,
    find_vit,
    layer_or_none,
    num_prefix_tokens,
    takes_any_size,
)
from vit_keras.layers import TokenPooling, TransformerBlock
from vit_keras.tokens.reduction import (
    REDUCTIONS,
    ReducedBlock,
    SizeWeightedPooling,
    is_reduced,
    reduced_blocks,
)

__all__ = ["default_prune_blocks", "merge_tokens", "prune_tokens", "token_budget",
           "token_counts"]


def merge_tokens(model: keras.Model, r: int | Sequence[int], name: str | None = None
                 ) -> keras.Model:
    """Token merging (ToMe; Bolya et al., ICLR 2023): in every block, after attention and
    before the MLP, the r most similar pairs of tokens (by their keys) are merged into their
    size-weighted mean, and later blocks weigh each key by its size (proportional attention).
    No training needed; the prefix tokens (class, distillation, registers) are never merged
    (docs/tokens.md has the rule in full).

    Args:
        model: a vk.vit model, or a model with one inside.
        r: the tokens each block merges away, one int for all or one per block; each block
            merges at most half of its tokens after the prefix. 0 merges nothing.
        name: the new model's name; by default model's with "_merged".

    Returns:
        A keras.Model with model's inputs, outputs and weights (the same variables).

    Raises:
        ValueError: model has no ViT in it, already has a token budget, takes any image size
            or has relative position embeddings; r is negative or has another length than
            the blocks.
    """
    vit, _ = find_vit(model)
    depth = len(blocks_of(vit))
    amounts = list(r) if isinstance(r, (list, tuple)) else [r] * depth
    if len(amounts) != depth or not all(isinstance(a, int) and a >= 0 for a in amounts):
        raise ValueError(f"r must be an int >= 0 or a list of {depth} of them (one per "
                         f"block), got {r!r}")
    return _rebuild(model, "merge", amounts, name)


def default_prune_blocks(depth: int) -> list[int]:
    """EViT's blocks for a model of that depth: a quarter, half and three quarters of the
    way through (0-based 3, 6 and 9 of 12: the paper's 4th, 7th and 10th)."""
    return sorted({depth // 4, depth // 2, 3 * depth // 4})


def prune_tokens(model: keras.Model, keep_rate: float = 0.7,
                 blocks: Sequence[int] | None = None, name: str | None = None) -> keras.Model:
    """Token pruning by class attention (EViT; Liang et al., ICLR 2022): at each of blocks,
    after attention and before the MLP, the patch tokens the class token attends to most are
    kept and the rest fused into one token weighted by that attention. Best after
    fine-tuning with it (model.fit on the returned model trains the shared weights).

    Args:
        model: a vk.vit model with a class token, or a model with one inside.
        keep_rate: the share of the tokens after the prefix each pruning block keeps,
            rounded up; 1.0 keeps all.
        blocks: the indices of the blocks that prune (negative ones count from the end);
            None for default_prune_blocks.
        name: the new model's name; by default model's with "_pruned".

    Returns:
        A keras.Model with model's inputs, outputs and weights (the same variables).

    Raises:
        ValueError: model has no ViT or no class token in it, already has a token budget,
            takes any image size or has relative position embeddings; keep_rate is outside
            (0, 1]; blocks names a block the model lacks.
    """
    vit, _ = find_vit(model)
    depth = len(blocks_of(vit))
    if not 0.0 < keep_rate <= 1.0:
        raise ValueError(f"keep_rate must be in (0, 1], got {keep_rate!r}")
    if isinstance(blocks, int):
        raise ValueError(f"blocks takes a list of block indices, got the int {blocks}")
    indices = default_prune_blocks(depth) if blocks is None else block_indices(blocks, depth)
    if layer_or_none(vit, configs.CLASS_TOKEN) is None:
        raise ValueError(f"prune_tokens ranks the patches by the class token's attention: "
                         f"model {vit.name!r} has no class token (build it with "
                         f"class_token=True)")
    amounts = [keep_rate if index in indices else 1.0 for index in range(depth)]
    return _rebuild(model, "prune", amounts, name)


def token_counts(model: keras.Model) -> list[int]:
    """The tokens each block of a ViT outputs, prefix tokens included, at its input size.

    Args:
        model: a vk.vit model (with or without a token budget), or a model with one inside.

    Returns:
        One count per block.
    """
    vit, _ = find_vit(model)
    if is_reduced(vit):
        return [block.output[0].shape[1] for block in reduced_blocks(vit)]
    return [block.output.shape[1] for block in blocks_of(vit)]


def token_budget(model: keras.Model) -> dict | None:
    """The token budget a model was built with (vk.merge_tokens, vk.prune_tokens), as the
    export report and the evaluate app record it, so that results of one model at several
    budgets are told apart.

    Args:
        model: a Keras model (a vk.vit, a model with one inside, or any other).

    Returns:
        None for a model without one (a model without a ViT among them); else
        {"method": "merge_tokens", "r": [one per block]} or {"method": "prune_tokens",
        "keep_rate": rate, "blocks": [the pruning blocks]}, with "tokens_per_block": the
        tokens each block outputs.
    """
    try:
        vit, _ = find_vit(model)
    except ValueError:  # no ViT in it, so no budget (the apps evaluate and export any model)
        return None
    blocks = reduced_blocks(vit)
    if not blocks:
        return None
    if blocks[0].kind == "merge":
        budget = {"method": "merge_tokens", "r": [block.amount for block in blocks]}
    else:
        pruning = [i for i, block in enumerate(blocks) if block.amount < 1.0]
        rate = blocks[pruning[0]].amount if pruning else 1.0
        budget = {"method": "prune_tokens", "keep_rate": rate, "blocks": pruning}
    return {**budget, "tokens_per_block": token_counts(model)}


def _check_reducible(vit: keras.Model, function: str) -> None:
    blocks = blocks_of(vit)
    if is_reduced(vit):
        raise ValueError(f"{function}: model {vit.name!r} already merges or prunes tokens; "
                         f"apply it to the model it was made from")
    if takes_any_size(vit):
        raise ValueError(f"{function} needs a fixed number of tokens: model {vit.name!r} "
                         f"takes any image size (dynamic_image_size=True); build it at one "
                         f"size")
    if any(block.position_bias for block in blocks):
        raise ValueError(f"{function}: model {vit.name!r} has posemb='relative', whose "
                         f"offsets assume the patches' grid, which reducing tokens takes away")


def _rebuild(model: keras.Model, kind: str, amounts: list, name: str | None) -> keras.Model:
    """model with each TransformerBlock wrapped in a ReducedBlock of that kind and amount,
    the sizes passed from block to block, and a "gap" read-out of merged tokens weighted by
    size; every other layer is model's own."""
    vit, _ = find_vit(model)
    _check_reducible(vit, REDUCTIONS[kind].function)
    prefix = num_prefix_tokens(vit)
    block_amounts, sizes = iter(amounts), None  # the blocks are called in order

    def call(layer, *args, **kwargs):
        nonlocal sizes
        if isinstance(layer, TransformerBlock):
            block = ReducedBlock(layer, kind, next(block_amounts), prefix,
                                 name=f"{layer.name}_{kind}")
            tokens, sizes = block(args[0], sizes)
            return tokens
        if (isinstance(layer, TokenPooling) and layer.method == "gap"
                and REDUCTIONS[kind].size_weighted):
            return SizeWeightedPooling(layer.num_prefix_tokens, dtype="float32",
                                       name=layer.name)(args[0], sizes)
        return layer(*args, **kwargs)

    rebuilt = keras.models.clone_model(model, clone_function=lambda layer: layer,
                                       call_function=call, recursive=True)
    return keras.Model(rebuilt.input, rebuilt.output,
                       name=name or f"{model.name}_{REDUCTIONS[kind].suffix}")
