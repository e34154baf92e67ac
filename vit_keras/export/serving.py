"""The model as deployed: uint8 images in, logits and probabilities out."""

from __future__ import annotations

import keras

from vit_keras import compat, configs
from vit_keras.intermediates import built_image_size
from vit_keras.layers import TransformerBlock
from vit_keras.preprocessing import input_convention, takes_raw_images
from vit_keras.tokens.reduction import ReducedBlock


def serving_model(model: keras.Model, fold_class_token: bool = False,
                  image_size: tuple[int, int] | None = None) -> keras.Model:
    """uint8 images -> {"logits", "probabilities"}: the model with its preprocessing inside,
    normalising by the model's input convention (vit_keras.preprocessing: [-1, 1], or the
    mean and standard deviation its release recorded), or passing the pixels on to a model
    that normalises them itself (include_preprocessing).

    Args:
        model: the Keras model (a vk.vit, or a model with one inside).
        fold_class_token: compute block 0's class-token rows at export (ClassTokenFolded),
            where the model has them; the function is unchanged.
        image_size: the fixed (height, width) a model of dynamic image size is served at;
            None for the model's own input, of any size for such a model.

    Returns:
        A keras.Model from uint8 "images" (batch, height, width, channels) to
        {"logits", "probabilities"}, both float32.
    """
    shape = model.input.shape[1:] if image_size is None else (*image_size,
                                                               model.input.shape[-1])
    images = keras.Input(shape, dtype="uint8", name="images")
    scaled = (images if takes_raw_images(model)
              else input_convention(model).layer(name="normalize")(images))
    if fold_class_token and ClassTokenFolded.applies_to(model, shape[:2]):
        model = ClassTokenFolded(model)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(model(scaled))
    probabilities = keras.layers.Softmax(dtype="float32", name="probabilities")(logits)
    return keras.Model(images, {"logits": logits, "probabilities": probabilities},
                       name=f"{model.name}_serving")


class ClassTokenFolded(keras.Model):
    """The same function with block 0's class-token rows computed once, in float32.

    Why: the class token (plus its position embedding) enters the residual stream far smaller
    than the patch tokens, so a full-integer file's per-tensor scales round it to zero, and
    block 0's LayerNorm 1/std, quantized over both ranges, loses the patch tokens' precision
    too. Those rows do not depend on the image: computing them here leaves the integer file
    only well-scaled tensors (docs/export.md measures the difference). A model that merges or
    prunes tokens (vk.merge_tokens, vk.prune_tokens) is folded alike: its first block is a
    ReducedBlock, and the layers after it pass the tokens' sizes along.

    Args:
        model: a ViT that applies_to says can be folded.
        **kwargs: keras.Model's arguments.
    """

    def __init__(self, model: keras.Model, **kwargs):
        super().__init__(name=model.name, **kwargs)
        embedding = own_node(model, model.get_layer(configs.EMBEDDING))
        self.patches = keras.Model(model.input, embedding.outputs[0])
        node = first_block_node(model)
        self.block = node.operation
        block = self.block.layer if isinstance(self.block, ReducedBlock) else self.block
        class_row = keras.ops.convert_to_numpy(model.get_layer(configs.CLASS_TOKEN).cls)
        table = model.get_layer(configs.POSITION_EMBEDDING).embedding()
        self.patch_posemb = None
        if table is not None:
            table = keras.ops.convert_to_numpy(table)
            class_row, self.patch_posemb = class_row + table[:, :1], table[:, 1:]
        self.class_row = class_row
        self.class_normed = keras.ops.convert_to_numpy(block.norm_0(class_row))
        self.norm_0 = block.norm_0
        # The model after its first block, from that block's outputs (tokens, and sizes).
        outputs = node.outputs
        self.rest = keras.Model(outputs if len(outputs) > 1 else outputs[0], model.output)

    @classmethod
    def applies_to(cls, model: keras.Model, image_size=None) -> bool:
        """Whether a model can be folded: vit()'s chain with a class token (cls, position
        embedding, blocks, ..., output), no other token or norm before the blocks
        (registers, distillation token, pre_norm), at the image size its position embedding
        is built for.

        Args:
            model: the Keras model.
            image_size: the (height, width) it is served at; None for its input size.

        Returns:
            True where ClassTokenFolded(model) computes the same function.
        """
        names = {layer.name for layer in model.layers}
        if not {configs.EMBEDDING, configs.CLASS_TOKEN, configs.POSITION_EMBEDDING} <= names:
            return False
        if {configs.REGISTERS, configs.DISTILLATION_TOKEN, configs.PRE_NORM} & names:
            return False
        first = first_block_node(model)
        if first is None:
            return False
        if tuple(image_size or model.input.shape[1:3]) != built_image_size(model):
            return False
        rest = model.layers[model.layers.index(first.operation):]
        # Only the model's own graph counts: a layer may be called elsewhere too (the
        # encoder norm in a vit_keras.intermediates.features model, say).
        nodes = [own_nodes(model, layer) for layer in rest]
        chained = all(len(later) == 1 and later[0].parent_nodes[0].operation is earlier
                      for earlier, later in zip(rest[:-1], nodes[1:], strict=True))
        return chained and nodes[-1][0].outputs[0] is model.output

    def call(self, images):
        patches = self.patches(images)
        if self.patch_posemb is not None:
            patches = patches + keras.ops.cast(self.patch_posemb, patches.dtype)
        shape = (keras.ops.shape(patches)[0], 1, patches.shape[-1])

        def class_rows(row):
            return keras.ops.broadcast_to(keras.ops.cast(row, patches.dtype), shape)

        x = keras.ops.concatenate([class_rows(self.class_row), patches], axis=1)
        normed = keras.ops.concatenate(
            [class_rows(self.class_normed), self.norm_0(patches)], axis=1)
        return self.rest(self.block(x, normed=normed))


def own_nodes(model: keras.Model, layer) -> list:
    """The nodes of model's own graph where layer is called: a model made from another by
    vk.merge_tokens or vk.prune_tokens calls the same layers, so .output would be the other's."""
    own = compat.own_node_ids(model)
    return [node for node in compat.inbound_nodes(layer) if id(node) in own]


def own_node(model: keras.Model, layer):
    """The first of own_nodes."""
    return own_nodes(model, layer)[0]


def first_block_node(model: keras.Model):
    """own_node of model's first block: a TransformerBlock, or the ReducedBlock wrapping one
    (a token budget); None where it has none."""
    blocks = [layer for layer in model.layers
              if isinstance(layer, (TransformerBlock, ReducedBlock))]
    return own_node(model, blocks[0]) if blocks else None
