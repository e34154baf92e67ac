"""vit(): the paper's model as a functional keras.Model, named like the official checkpoint tree."""

from __future__ import annotations

import re

import keras

from vit_keras import configs, kernels
from vit_keras.configs import ViTConfig, as_pair, get_config
from vit_keras.layers import (
    ClassToken,
    PatchEmbedding,
    TokenPooling,
    TransformerBlock,
    layer_norm,
)
from vit_keras.position_embeddings import AddPositionEmbedding, check_position_embedding
from vit_keras.resnet import resnet_stem
from vit_keras.weights import load_weights

CLASSIFIERS = TokenPooling.METHODS


def vit(
    variant: str | ViTConfig | dict = "B/16",
    image_size: int | tuple[int, int] = 224,
    num_classes: int = 1000,
    classifier: str = "token",
    representation_size: int | None = None,
    posemb: str = "learned",
    dropout_rate: float = 0.0,
    attention_dropout_rate: float = 0.0,
    stochastic_depth_rate: float = 0.0,
    include_top: bool = True,
    weights: str | None = None,
    approximate_gelu: bool = True,
    attention_kernel: str = "auto",
    remat: bool = False,
    layer_scale: float | None = None,
    qkv_bias: bool = True,
    head_bias_init: float = 0.0,
    channels: int = 3,
    dynamic_image_size: bool = False,
    name: str | None = None,
) -> keras.Model:
    """Builds a Vision Transformer.

    variant: "B/16" and friends or a hybrid such as "R50+B/16" (see vk.VARIANTS), a
    ViTConfig, or a dict of its fields.
    The input is float images (batch, height, width, channels) in [-1, 1] (vk.preprocess).
    The output is logits (include_top) or the pooled representation; float32 under any
    mixed-precision policy, since the read-out and head run in float32.
    classifier: "token" (the class token) or "gap" (global average pooling).
    posemb: a kind of vit_keras.position_embeddings.POSITION_EMBEDDINGS.
    approximate_gelu=True is the tanh GELU the official checkpoints were trained with;
    False gives the exact erf GELU of timm and Hugging Face.
    attention_kernel: "auto", "fused" or "einsum" (vit_keras.kernels).
    remat: recompute each block in the backward pass instead of keeping its activations
    (layers.TransformerBlock), for models that do not fit otherwise.
    stochastic_depth_rate: drop-path rate of the last block, rising linearly from 0.
    layer_scale: LayerScale's initial value on every residual branch (DeiT III, DINOv2),
    None for the paper's blocks. qkv_bias=False: query, key and value without biases. Both
    are for weight families after the paper (docs/weights.md).
    weights: a local .npz / .keras / .weights.h5 / PyTorch file, or a pre-trained name such
    as "augreg_in21k" (vit_keras.weights.pretrained), downloaded once into the Keras cache.
    dynamic_image_size: take images of any height and width that are multiples of the patch
    size (a hybrid's cell), fitting the position embeddings to each image's grid inside the
    model (AddPositionEmbedding); image_size is then the size they are learned at, and the
    outputs at that size are the fixed-size model's (docs/features.md).
    """
    config = get_config(variant)
    _check_arguments(config, image_size, num_classes, classifier, posemb, include_top,
                     attention_kernel, dropout_rate=dropout_rate,
                     attention_dropout_rate=attention_dropout_rate,
                     stochastic_depth_rate=stochastic_depth_rate)
    height, width = as_pair(image_size, "image_size")
    shape = (None, None) if dynamic_image_size else (height, width)
    inputs = keras.Input((*shape, channels), name="images")
    block_options = {"approximate_gelu": approximate_gelu, "attention_kernel": attention_kernel,
                     "remat": remat, "layer_scale": layer_scale, "qkv_bias": qkv_bias}
    x = _encoder(inputs, (height, width), dynamic_image_size, config, classifier, posemb,
                 dropout_rate, attention_dropout_rate, stochastic_depth_rate, block_options)
    x = TokenPooling(classifier, dtype="float32", name=configs.POOL)(x)
    if representation_size:
        x = keras.layers.Dense(representation_size, activation="tanh", dtype="float32",
                               kernel_initializer="lecun_normal", name=configs.PRE_LOGITS)(x)
    if include_top:
        x = keras.layers.Dense(
            num_classes, kernel_initializer="zeros", dtype="float32",
            bias_initializer=keras.initializers.Constant(head_bias_init), name=configs.HEAD,
        )(x)
    model = keras.Model(inputs, x, name=name or _model_name(variant, config))
    if weights is not None:
        load_weights(model, weights, variant=variant)
    return model


def _encoder(images, image_size, dynamic: bool, config: ViTConfig, classifier, posemb,
             dropout_rate, attention_dropout_rate, stochastic_depth_rate, block_options: dict):
    """Images -> the encoder's normalised tokens (batch, tokens, D); image_size is what the
    position embeddings are built for, fitted to each image's grid when dynamic;
    block_options are the TransformerBlock arguments every block shares."""
    x = images
    if config.is_hybrid:
        x = resnet_stem(x, config.resnet_layers, config.resnet_width)
    embedding = PatchEmbedding(config.patch_size, config.hidden_size, name=configs.EMBEDDING)
    grid = embedding.grid_size(tuple(side // config.stem_stride for side in image_size))
    x = embedding(x)
    num_prefix = 1 if classifier == "token" else 0
    if num_prefix:
        x = ClassToken(name=configs.CLASS_TOKEN)(x)
    position = AddPositionEmbedding(grid, num_prefix, posemb, stride=config.cell_size,
                                    name=configs.POSITION_EMBEDDING)
    x = position(x, images=images) if dynamic else position(x)
    x = keras.layers.Dropout(dropout_rate, name="Transformer_dropout")(x)
    depth = config.num_layers
    for i in range(depth):
        x = TransformerBlock(
            config.num_heads, config.mlp_dim, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=stochastic_depth_rate * i / max(depth - 1, 1),
            name=configs.block_name(i), **block_options,
        )(x)
    return layer_norm(configs.ENCODER_NORM)(x)


def _check_arguments(config, image_size, num_classes, classifier, posemb, include_top,
                     attention_kernel, **rates) -> None:
    if classifier not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {classifier!r}: expected one of "
                         f"{', '.join(CLASSIFIERS)}")
    check_position_embedding(posemb)
    kernels.check_attention_kernel(attention_kernel)
    for rate_name, rate in rates.items():
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{rate_name} must be in [0, 1), got {rate!r}")
    if include_top and (not isinstance(num_classes, int) or num_classes < 1):
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    height, width = as_pair(image_size, "image_size")
    if config.is_hybrid and (height % config.cell_size or width % config.cell_size):
        raise ValueError(f"image_size {height}x{width} is not divisible by the hybrid's "
                         f"{config.cell_size}-pixel cells (ResNet stride {config.stem_stride} "
                         f"x patch size {config.patch_size})")


def _model_name(variant, config: ViTConfig) -> str:
    if isinstance(variant, str):
        return "vit_" + re.sub(r"[/+]", "_", variant).lower()
    return f"vit_d{config.hidden_size}_l{config.num_layers}_p{config.patch_size}"
