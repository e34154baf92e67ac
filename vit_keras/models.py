"""vit(): the paper's model as a functional keras.Model, named like the official checkpoint tree."""

from __future__ import annotations

import re

import keras

from vit_keras.configs import ViTConfig, get_config
from vit_keras.layers import (
    POSEMB_KINDS,
    AddPositionEmbedding,
    ClassToken,
    PatchEmbedding,
    TokenPooling,
    TransformerBlock,
    as_pair,
    layer_norm,
)
from vit_keras.resnet import resnet_stem

CLASSIFIERS = ("token", "gap")


def checkpoint_name(layer_name: str) -> str:
    """Keras forbids '/' in layer names; ours use '_' after 'Transformer' and between a
    ResNet stage and its unit instead."""
    prefix = "Transformer_"
    if layer_name.startswith(prefix):
        return "Transformer/" + layer_name[len(prefix):]
    return re.sub(r"^(block\d+)_(unit\d+)$", r"\1/\2", layer_name)


def _check_rate(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")


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
    head_bias_init: float = 0.0,
    channels: int = 3,
    name: str | None = None,
) -> keras.Model:
    """Builds a Vision Transformer.

    variant: "B/16" and friends or a hybrid such as "R50+B/16" (see vk.VARIANTS), a
    ViTConfig, or a dict of its fields.
    The input is float images (batch, height, width, channels) in [-1, 1] (vk.preprocess).
    The output is logits (include_top) or the pooled representation; float32 under any
    mixed-precision policy, since the read-out and head run in float32.
    approximate_gelu=True is the tanh GELU the official checkpoints were trained with;
    False gives the exact erf GELU of timm and Hugging Face. Under a bfloat16 compute dtype
    the exact one is computed either way (layers.computes_tanh_gelu says why).
    stochastic_depth_rate: drop-path rate of the last block, rising linearly from 0.
    weights: a local .npz / .keras / .weights.h5 file, or a pre-trained name such as
    "augreg_in21k" (vit_keras.pretrained), downloaded once into the Keras cache.
    """
    config = get_config(variant)
    if classifier not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {classifier!r}: expected one of "
                         f"{', '.join(CLASSIFIERS)}")
    if posemb not in POSEMB_KINDS:
        raise ValueError(f"unknown position embedding {posemb!r}: expected one of "
                         f"{', '.join(POSEMB_KINDS)}")
    for rate_name, rate in (("dropout_rate", dropout_rate),
                            ("attention_dropout_rate", attention_dropout_rate),
                            ("stochastic_depth_rate", stochastic_depth_rate)):
        _check_rate(rate_name, rate)
    if include_top and (not isinstance(num_classes, int) or num_classes < 1):
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    height, width = as_pair(image_size, "image_size")
    if config.is_hybrid and (height % config.cell_size or width % config.cell_size):
        raise ValueError(f"image_size {height}x{width} is not divisible by the hybrid's "
                         f"{config.cell_size}-pixel cells (ResNet stride {config.stem_stride} "
                         f"x patch size {config.patch_size})")

    embedding = PatchEmbedding(config.patch_size, config.hidden_size, name="embedding")
    grid = embedding.grid_size((height // config.stem_stride, width // config.stem_stride))
    inputs = keras.Input((height, width, channels), name="images")
    x = inputs
    if config.is_hybrid:
        x = resnet_stem(x, config.resnet_layers, config.resnet_width)
    x = embedding(x)
    num_prefix = 1 if classifier == "token" else 0
    if num_prefix:
        x = ClassToken(name="cls")(x)
    x = AddPositionEmbedding(grid, num_prefix, posemb, name="Transformer_posembed_input")(x)
    x = keras.layers.Dropout(dropout_rate, name="Transformer_dropout")(x)
    depth = config.num_layers
    for i in range(depth):
        x = TransformerBlock(
            config.num_heads, config.mlp_dim, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=stochastic_depth_rate * i / max(depth - 1, 1),
            approximate_gelu=approximate_gelu, name=f"Transformer_encoderblock_{i}",
        )(x)
    x = layer_norm("Transformer_encoder_norm")(x)
    x = TokenPooling(classifier, dtype="float32", name="pool")(x)
    if representation_size:
        x = keras.layers.Dense(representation_size, activation="tanh", dtype="float32",
                               kernel_initializer="lecun_normal", name="pre_logits")(x)
    if include_top:
        x = keras.layers.Dense(
            num_classes, kernel_initializer="zeros", dtype="float32",
            bias_initializer=keras.initializers.Constant(head_bias_init), name="head",
        )(x)
    model = keras.Model(inputs, x, name=name or _model_name(variant, config))
    if weights is not None:
        from vit_keras import checkpoints, pretrained

        if pretrained.is_name(weights):
            weights = pretrained.fetch(variant, weights)
        checkpoints.load_weights(model, weights)
    return model


def _model_name(variant, config: ViTConfig) -> str:
    if isinstance(variant, str):
        return "vit_" + re.sub(r"[/+]", "_", variant).lower()
    return f"vit_d{config.hidden_size}_l{config.num_layers}_p{config.patch_size}"
