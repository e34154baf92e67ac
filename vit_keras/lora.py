"""Low-rank adaptation (LoRA, Hu et al. 2021) of a ViT with Keras' own enable_lora, and
merging the adapters back into plain weights."""

from __future__ import annotations

import keras

from vit_keras import compat, configs
from vit_keras.weights.assign import load_params
from vit_keras.weights.npz import model_params

__all__ = ["TARGETS", "lora", "merge_lora"]

# The dense layers of an encoder block that can take adapters, by their checkpoint names.
TARGETS = ("query", "key", "value", "out", "Dense_0", "Dense_1")
"""The dense layers of an encoder block that lora() can give adapters, by their checkpoint
names: attention's query, key, value and out, and the MLP's Dense_0 and Dense_1."""


def _block_dense_layers(model: keras.Model):
    """(name, layer) of every targetable dense layer in the encoder blocks."""
    for layer in model.layers:
        if layer.name.startswith(configs.BLOCK_PREFIX):
            for name, attr in (("query", "query"), ("key", "key"), ("value", "value"),
                               ("out", "out")):
                yield name, getattr(layer.attention, attr)
            yield "Dense_0", layer.mlp.dense_0
            yield "Dense_1", layer.mlp.dense_1


def lora(model: keras.Model, rank: int = 8, targets=("query", "value"),
         alpha: float | None = None, train_head: bool = True) -> keras.Model:
    """Freezes a ViT and gives the targeted dense layers of every encoder block trainable
    low-rank adapters, with Keras' own enable_lora.

    Each adapted kernel becomes kernel + alpha / rank * A B, with B starting at zero, so the
    model computes what it did until it trains; its biases stay frozen. The head and
    pre_logits stay trainable by default, since a new task's head starts untrained. The
    model changes in place.

    Args:
        model: a vk.vit model.
        rank: the adapters' rank, a positive int.
        targets: which dense layers of each block take adapters, some of TARGETS: "query",
            "key", "value", "out" (attention) and "Dense_0", "Dense_1" (the MLP). The default,
            query and value, is the LoRA paper's.
        alpha: the adapters' scale numerator (kernel + alpha / rank * A B); None is rank, a
            scale of 1, as Keras' enable_lora has it.
        train_head: False freezes the head and pre_logits too, leaving only the adapters
            trainable.

    Returns:
        The same model, for chaining.

    Raises:
        ValueError: targets empty or naming a layer outside TARGETS, or rank not a positive
            int.
    """
    unknown = set(targets) - set(TARGETS)
    if unknown or not targets:
        raise ValueError(f"LoRA targets must be some of {', '.join(TARGETS)}, got "
                         f"{list(targets)}")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA rank must be a positive int, got {rank!r}")
    trainable_tops = {configs.HEAD, configs.PRE_LOGITS} if train_head else set()
    for layer in model.layers:
        layer.trainable = layer.name in trainable_tops
    for layer in model.layers:
        if layer.name.startswith(configs.BLOCK_PREFIX):
            layer.trainable = True
            for sublayer in compat.flatten_layers(layer, include_self=False):
                sublayer.trainable = False
    for name, layer in _block_dense_layers(model):
        if name in targets:
            layer.trainable = True
            layer.enable_lora(rank, lora_alpha=alpha)
            layer.bias.trainable = False
    return model


def _without_lora(config):
    """A model config with every LoRA rank taken out."""
    if isinstance(config, dict):
        return {k: _without_lora(v) for k, v in config.items()
                if k not in ("lora_rank", "lora_alpha")}
    if isinstance(config, list):
        return [_without_lora(v) for v in config]
    return config


def merge_lora(model: keras.Model) -> keras.Model:
    """A plain copy of a LoRA model: the same function, with each adapter added into its
    kernel and no LoRA weights left, so it saves, exports and loads as a model without LoRA
    (save_npz writes the same merged kernels).

    Args:
        model: a model given adapters by lora (or any ViT; one without adapters is copied).

    Returns:
        A new keras.Model with the same layers, without adapters; model is not changed.
    """
    plain = keras.Model.from_config(_without_lora(model.get_config()))
    load_params(plain, model_params(model), source=model.name, layout="merged LoRA model")
    return plain
