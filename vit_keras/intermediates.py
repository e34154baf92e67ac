"""What a ViT computes on the way to its output, as a functional Keras model that serialises
and exports: the tokens of any blocks, patch tokens as (batch, grid_h, grid_w, D) maps with the
prefix tokens apart, and the pooled representation (timm's forward_intermediates), for
detection, segmentation, retrieval and probing. Also finds the ViT inside a bigger model.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import ops

from vit_keras import compat, configs
from vit_keras.layers import TransformerBlock
from vit_keras.position_embeddings import AddPositionEmbedding, image_grid
from vit_keras.tokens.reduction import is_reduced, reduced_blocks

__all__ = ["PatchTokens", "built_image_size", "features", "find_vit", "takes_any_size"]

POOLED = "pooled"


def is_vit(model: keras.Model) -> bool:
    """Whether model is a ViT itself (it has the position-embedding layer), not a model
    with one inside."""
    return any(isinstance(layer, AddPositionEmbedding) for layer in model.layers)


def find_vit(model: keras.Model) -> tuple[keras.Model, keras.Model | None]:
    """Finds the ViT in a model: the model itself, or a ViT nested as a layer of it at any
    depth (a classifier wrapped around a ViT backbone, a model with preprocessing in front),
    so that the tools for a ViT's insides take either.

    Args:
        model: a keras.Model that is or contains a vk.vit model.

    Returns:
        (vit, feeder): the ViT, and a keras.Model from model's inputs to the ViT's images, or
        None when model is the ViT itself.

    Raises:
        ValueError: model has no ViT in it.
    """
    if is_vit(model):
        return model, None
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            try:
                vit, inner = find_vit(layer)
            except ValueError:
                continue
            return vit, fed_by(_feeder(model, layer), inner)
    raise ValueError(f"model {model.name!r} has no ViT in it (no AddPositionEmbedding layer in "
                     "it or in any model among its layers)")


def _feeder(model: keras.Model, layer: keras.Model) -> keras.Model:
    """model's inputs -> what model passes to layer."""
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
    for node in compat.inbound_nodes(layer):
        try:
            return keras.Model(inputs, node.input_tensors[0])
        except ValueError:
            continue
    raise ValueError(f"model {model.name!r} does not call {layer.name!r} on its inputs")


def fed_by(feeder: keras.Model | None, model: keras.Model | None) -> keras.Model | None:
    """model applied to what feeder gives: feeder's inputs -> model's outputs (either may be
    None, for nothing to apply)."""
    if feeder is None or model is None:
        return model or feeder
    return keras.Model(feeder.input, model(feeder.output), name=model.name)


def cell_size(vit: keras.Model) -> int:
    """Pixels per token along each side: the patch size of a plain ViT, ResNet stride x patch
    size of a hybrid."""
    layer = vit.get_layer(configs.POSITION_EMBEDDING)
    return layer.stride or vit.input.shape[1] // layer.grid_size[0]


def layer_or_none(vit: keras.Model, name: str):
    """vit's layer of that name, None where the model has none (an option it was built
    without)."""
    return next((layer for layer in vit.layers if layer.name == name), None)


def num_prefix_tokens(vit: keras.Model) -> int:
    """The tokens before the patch tokens: class and distillation tokens (those the position
    embedding covers) and register tokens."""
    registers = layer_or_none(vit, configs.REGISTERS)
    return (vit.get_layer(configs.POSITION_EMBEDDING).num_prefix_tokens
            + (registers.num_tokens if registers else 0))


def final_norm(vit: keras.Model):
    """The LayerNorm after the last block; None for a model with fc_norm (whose norm is after
    pooling), where timm's features are unnormalised too."""
    return layer_or_none(vit, configs.ENCODER_NORM)


def takes_any_size(vit: keras.Model) -> bool:
    """Whether a ViT was built with dynamic_image_size, taking images of any size: its
    input's height and width are None.

    Args:
        vit: a vk.vit model.

    Returns:
        True for a model that takes any size.
    """
    return None in vit.input.shape[1:3]


def built_image_size(vit: keras.Model) -> tuple[int, int]:
    """The image size a ViT's position embedding is built for: its input size, or for a model
    that takes any size (dynamic_image_size), the size its embedding is learned at.

    Args:
        vit: a vk.vit model.

    Returns:
        (height, width) in pixels.
    """
    if not takes_any_size(vit):
        return tuple(vit.input.shape[1:3])
    layer = vit.get_layer(configs.POSITION_EMBEDDING)
    return tuple(side * layer.stride for side in layer.grid_size)


def blocks_of(vit: keras.Model) -> list[TransformerBlock]:
    """The encoder blocks, in order."""
    return [layer for layer in vit.layers if isinstance(layer, TransformerBlock)]


def refuse_token_budget(vit: keras.Model, tool: str) -> None:
    """Raises for a ViT that merges or prunes tokens, whose blocks no longer see the grid of
    patches that tool reads.

    Raises:
        ValueError: naming the tool and vk.merge_tokens / vk.prune_tokens.
    """
    if is_reduced(vit):
        raise ValueError(f"{tool} reads every block's tokens on the image's grid of patches; "
                         f"model {vit.name!r} merges or prunes tokens (vk.merge_tokens / "
                         f"vk.prune_tokens), so later blocks have no such grid: give it the "
                         f"model the token budget was applied to")


def block_indices(blocks: int | Sequence[int], depth: int) -> list[int]:
    """blocks: n for the last n blocks, or indices (negative ones count from the end)."""
    if isinstance(blocks, int):
        if not 1 <= blocks <= depth:
            raise ValueError(f"blocks={blocks}: expected 1 to {depth} (the model's blocks) or a "
                             "list of block indices")
        return list(range(depth - blocks, depth))
    indices = []
    for index in blocks:
        if not -depth <= index < depth:
            raise ValueError(f"block index {index} is out of range for a model of {depth} "
                             f"blocks: expected {-depth} to {depth - 1}")
        if index % depth in indices:
            raise ValueError(f"block {index % depth} is asked for twice in blocks={blocks}")
        indices.append(index % depth)
    return indices


@keras.saving.register_keras_serializable(package="vit_keras")
class PatchTokens(keras.layers.Layer):
    """Splits tokens (batch, prefix + patches, D) into the prefix tokens (batch, prefix, D) and
    the patch tokens, as a (batch, grid_h, grid_w, D) map when spatial. The grid is the
    images' size over stride, read from the images each call, so it follows the input of a
    model that takes any size.

    Args:
        num_prefix_tokens: the class, distillation and register tokens before the patches.
        stride: pixels per token along each side (the patch size; a hybrid's cell).
        spatial: reshape the patch tokens to the image's grid; False keeps them a sequence.
        **kwargs: a Keras layer's arguments (name, dtype).
    """

    def __init__(self, num_prefix_tokens: int, stride: int, spatial: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = num_prefix_tokens
        self.stride = stride
        self.spatial = spatial

    def call(self, tokens, images):
        prefix, patches = tokens[:, :self.num_prefix_tokens], tokens[:, self.num_prefix_tokens:]
        if self.spatial:
            patches = ops.reshape(patches, (-1, *image_grid(images, self.stride),
                                            tokens.shape[-1]))
        return prefix, patches

    def compute_output_shape(self, tokens_shape, images_shape):
        batch, _, width = tokens_shape
        if self.spatial:
            grid = tuple(None if side is None else side // self.stride
                         for side in images_shape[1:3])
            patches = (batch, *grid, width)
        else:
            patches = (batch, None if tokens_shape[1] is None
                       else tokens_shape[1] - self.num_prefix_tokens, width)
        return (batch, self.num_prefix_tokens, width), patches

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens,
                "stride": self.stride, "spatial": self.spatial}


def features(model: keras.Model, blocks: int | Sequence[int] = 4, norm: bool = True,
             spatial: bool = True, prefix_tokens: bool = False, pooled: bool = False,
             name: str | None = None) -> keras.Model:
    """What a ViT computes on the way to its output, as a functional keras.Model that
    serialises and exports: any blocks' tokens, the patch tokens as image-shaped maps, and the
    pooled representation (timm's forward_intermediates), for detection, segmentation,
    retrieval and probing. The ViT may sit inside a bigger model (find_vit).

    Args:
        model: a vk.vit model, or a model with one inside.
        blocks: n for the last n blocks, or block indices (negative ones count from the end).
        norm: pass each block's tokens through the encoder's final LayerNorm, as the last
            block's are before pooling; False gives the raw residual stream (a model with
            fc_norm has no such norm, and gives it either way).
        spatial: patch tokens as (batch, grid_h, grid_w, D) maps; False keeps them
            (batch, patches, D).
        prefix_tokens: also output each block's prefix tokens (class, distillation,
            registers), on a model that has them.
        pooled: also output the representation the head reads (pre_logits, else the pooled
            tokens).
        name: the model's name; by default the ViT's name with "_features".

    Returns:
        A keras.Model from model's inputs to a dict: "block{i}" (block i's patch tokens),
        "block{i}_prefix" (its prefix tokens, with prefix_tokens) and "pooled" (with
        pooled). A model that merges or prunes tokens (vk.merge_tokens, vk.prune_tokens)
        also gives "block{i}_sizes" (batch, tokens, 1): how many patches each of block i's
        tokens stands for.

    Raises:
        ValueError: model has no ViT in it, or blocks asks for a block it does not have or
            for one twice; spatial maps of a model that merges or prunes tokens.
    """
    vit, feeder = find_vit(model)
    reduced = reduced_blocks(vit)
    if reduced and spatial:
        raise ValueError(f"model {vit.name!r} merges or prunes tokens (vk.merge_tokens / "
                         f"vk.prune_tokens), so its tokens lie on no grid: call features with "
                         f"spatial=False")
    indices = block_indices(blocks, len(reduced or blocks_of(vit)))
    prefix_count = num_prefix_tokens(vit)
    split = PatchTokens(prefix_count, cell_size(vit), spatial,
                        name="spatial_tokens" if spatial else "patch_tokens")
    normalise = final_norm(vit) if norm else None
    outputs = {}
    for index in indices:
        if reduced:
            tokens, sizes = reduced[index].output
            outputs[f"block{index}_sizes"] = split(sizes, images=vit.input)[1]
        else:
            tokens = vit.get_layer(configs.block_name(index)).output
        if normalise is not None:
            tokens = normalise(tokens)
        prefix, outputs[f"block{index}"] = split(tokens, images=vit.input)
        if prefix_tokens and prefix_count:
            outputs[f"block{index}_prefix"] = prefix
    if pooled:
        outputs[POOLED] = vit.get_layer(representation_layer(vit)).output
    return fed_by(feeder, keras.Model(vit.input, outputs, name=name or f"{vit.name}_features"))


def representation_layer(vit: keras.Model) -> str:
    """The layer whose output the head reads: pre_logits if present, else the pooling."""
    return configs.PRE_LOGITS if layer_or_none(vit, configs.PRE_LOGITS) else configs.POOL
