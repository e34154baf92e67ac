"""Masked patch prediction, the paper's self-supervised pre-training (Section 4.6, Appendix
B.1.2): a share of the patch embeddings is corrupted (of those, 80% replaced by a learned
[mask] embedding, 10% by another patch's embedding of the same image, 10% kept) and each
corrupted patch's colour is predicted from its output token.

The tf.data pipeline draws the corruption (deterministic for a seed) and computes the
targets; the model is a vk.vit backbone with a corruption layer after its patch embedding
and a prediction head that fine-tuning leaves behind (the backbone keeps its own weights).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import keras
import tensorflow as tf
from keras import ops

from vit_keras import configs, training
from vit_keras.intermediates import (
    PatchTokens,
    blocks_of,
    cell_size,
    final_norm,
    num_prefix_tokens,
    takes_any_size,
)
from vit_keras.layers import PatchDropout
from vit_keras.weights.files import portable_jit_compile

__all__ = ["TARGETS", "MaskedPatchCorruption", "Target", "compile_masked_patch_model",
           "draw_corruption", "masked_patch_model", "masked_patch_pipeline"]

MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the corrupted patches; the rest (10%) are kept
COLOR_BITS = 3
LEVELS = 2**COLOR_BITS


def quantize(values, channels: int):
    """[0, 1] colours (..., channels) -> one class of LEVELS**channels per colour: each
    channel's 3-bit level, the first channel the most significant."""
    levels = tf.minimum(tf.cast(values * LEVELS, tf.int32), LEVELS - 1)
    weights = tf.constant([LEVELS ** (channels - 1 - c) for c in range(channels)], tf.int32)
    return tf.reduce_sum(levels * weights, axis=-1)


def image_patches(images, patch_size: int):
    """(batch, H, W, C) -> (batch, patches, P, P, C), row-major over the grid."""
    batch, height, width, channels = (tf.shape(images)[i] for i in range(4))
    grid_h, grid_w = height // patch_size, width // patch_size
    x = tf.reshape(images, (batch, grid_h, patch_size, grid_w, patch_size, channels))
    x = tf.transpose(x, (0, 1, 3, 2, 4, 5))
    return tf.reshape(x, (batch, grid_h * grid_w, patch_size, patch_size, channels))


@dataclasses.dataclass(frozen=True)
class Target:
    """What is predicted for each corrupted patch: one record per kind in TARGETS, so that a
    new target is one more entry.

    Args:
        name: the target's name in TARGETS.
        make: make(patches in [0, 1] (batch, N, P, P, C), color_channels) gives the targets.
        outputs: outputs(color_channels) is the head's shape per patch (None for "pixels",
            whose shape is the patch's).
        classification: cross-entropy over classes (the last output axis); False is L2
            regression.
    """

    name: str
    make: Callable
    outputs: Callable
    classification: bool = True


def _mean_color(patches, channels):
    return quantize(tf.reduce_mean(patches[..., :channels], axis=(2, 3)), channels)


def _downsized(patches, channels):
    """The patch shrunk to 4x4 by averaging, each cell in 3-bit colour: 16 classes each."""
    batch, count, size = tf.shape(patches)[0], tf.shape(patches)[1], patches.shape[2]
    cells = tf.reshape(patches[..., :channels], (batch, count, 4, size // 4, 4, size // 4,
                                                  channels))
    return tf.reshape(quantize(tf.reduce_mean(cells, axis=(3, 5)), channels),
                      (batch, count, 16))


def _pixels(patches, _channels):
    batch, count = tf.shape(patches)[0], tf.shape(patches)[1]
    return tf.reshape(patches * 2.0 - 1.0, (batch, count, -1))


TARGETS: dict[str, Target] = {t.name: t for t in (
    # The paper's choice: the mean colour of the patch, 3 bits a channel (512 classes in RGB).
    Target("mean_color", _mean_color, lambda channels: (LEVELS**channels,)),
    # A 4x4 downsized patch in 3-bit colour: 16 predictions of 512 classes in RGB.
    Target("downsized", _downsized, lambda channels: (16, LEVELS**channels)),
    # L2 regression on the full patch, in the model's [-1, 1] pixel range.
    Target("pixels", _pixels, None, classification=False),
)}
"""The masked-patch targets by name: "mean_color" (the paper's: each corrupted patch's mean
colour, 3 bits a channel), "downsized" (a 4x4 version in 3-bit colour) and "pixels" (L2
regression on the whole patch)."""


def check_target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown masked-patch target {name!r}: expected one of "
                         f"{', '.join(TARGETS)}")
    return TARGETS[name]


def draw_corruption(batch: int, count: int, rate: float, seed):
    """(selected, sources, masked), each (batch, count): which patches are corrupted (exactly
    round(rate * count) an image), the patch each token's embedding is taken from (itself,
    or a random other patch for the RANDOM_SHARE), and which become the [mask] embedding.
    Stateless, so that a seed gives the same corruption on every run.

    Args:
        batch: the images in the batch.
        count: the patches per image.
        rate: the share of patches corrupted.
        seed: a stateless seed, two int32 values.

    Returns:
        (selected, sources, masked) tensors, each (batch, count).
    """
    seeds = tf.random.experimental.stateless_split(seed, 3)
    order = tf.argsort(tf.random.stateless_uniform((batch, count), seeds[0]), axis=1)
    ranks = tf.argsort(order, axis=1)
    selected = ranks < tf.cast(tf.round(rate * tf.cast(count, tf.float32)), tf.int32)
    action = tf.random.stateless_uniform((batch, count), seeds[1])
    masked = selected & (action < MASK_SHARE)
    replaced = selected & (action >= MASK_SHARE) & (action < MASK_SHARE + RANDOM_SHARE)
    offset = tf.random.stateless_uniform((batch, count), seeds[2], minval=1,
                                         maxval=tf.maximum(count, 2), dtype=tf.int32)
    own = tf.range(count)[None]
    sources = tf.where(replaced, (own + offset) % count, own)
    return selected, sources, masked


def masked_patch_pipeline(batches: tf.data.Dataset, patch_size: int,
                          target: str = "mean_color", rate: float = 0.5,
                          color_channels: int = 3, seed: int = 0) -> tf.data.Dataset:
    """Batches of ([-1, 1] images, labels) -> ({"images", "sources", "masked"}, targets,
    weights): the labels are dropped, the corruption drawn per batch from (seed, batch index)
    and the targets computed from the uncorrupted images; weights are 1 on the corrupted
    patches (on each of their predictions), which alone the loss counts.

    Args:
        batches: a dataset of ([-1, 1] images, labels) batches (data.make_pipeline).
        patch_size: the model's patch size.
        target: a name in TARGETS: "mean_color" (the paper's), "downsized" or "pixels".
        rate: the share of patches corrupted, in (0, 1] (the paper's 50%).
        color_channels: 3 for colour, 1 for grayscale images (repeated to RGB or not): their
            mean intensity in 3 bits, 8 classes.
        seed: the seed the corruption of each batch is drawn from, with its index.

    Returns:
        The tf.data.Dataset of (inputs, targets, weights) for masked_patch_model.

    Raises:
        ValueError: a rate outside (0, 1], an unknown target, or "downsized" with a patch
            size that is not a multiple of 4.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"corruption rate must be in (0, 1], got {rate!r}")
    kind = check_target(target)
    if target == "downsized" and patch_size % 4:
        raise ValueError(f"the downsized target shrinks patches to 4x4: patch size "
                         f"{patch_size} is not a multiple of 4")

    def prepare(index, batch):
        images = batch[0]
        patches = image_patches((images + 1.0) / 2.0, patch_size)
        shape = tf.shape(patches)
        selected, sources, masked = draw_corruption(
            shape[0], shape[1], rate, tf.stack([tf.cast(seed, tf.int64), index]))
        inputs = {"images": images, "sources": sources, "masked": masked}
        targets, weights = kind.make(patches, color_channels), tf.cast(selected, tf.float32)
        if kind.classification and targets.shape.rank == 3:  # one weight per prediction
            weights = tf.broadcast_to(weights[..., None], tf.shape(targets))
        return inputs, targets, weights

    return batches.enumerate().map(prepare, num_parallel_calls=tf.data.AUTOTUNE)


@keras.saving.register_keras_serializable(package="vit_keras")
class MaskedPatchCorruption(keras.layers.Layer):
    """Patch tokens as the pipeline corrupted them: each token becomes the embedding of the
    patch `sources` names, and the learned [mask] embedding where `masked`. Called as
    layer(tokens, sources=..., masked=...), each (batch, patches)."""

    def build(self, input_shape):
        self.mask_embedding = self.add_weight(
            name="mask_embedding", shape=(1, 1, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, tokens, sources, masked):
        index = ops.broadcast_to(ops.cast(sources, "int32")[..., None], ops.shape(tokens))
        tokens = ops.take_along_axis(tokens, index, axis=1)
        return ops.where(ops.cast(masked, "bool")[..., None],
                         ops.cast(self.mask_embedding, tokens.dtype), tokens)

    def compute_output_shape(self, input_shape):
        return input_shape


def masked_patch_model(backbone: keras.Model, target: str = "mean_color",
                       color_channels: int = 3) -> keras.Model:
    """{"images", "sources", "masked"} -> per-patch predictions (batch, patches, *outputs),
    through the backbone's own layers (a plain vk.vit, not a hybrid), so training this model
    trains the backbone; the head "mpp_head" is this model's alone, and fine-tuning leaves it
    behind.

    Args:
        backbone: a plain vk.vit model without patch dropout.
        target: a name in TARGETS.
        color_channels: 3 for colour, 1 for grayscale (as the pipeline's).

    Returns:
        The keras.Model that masked_patch_pipeline's batches train.

    Raises:
        ValueError: an unknown target, a hybrid backbone, or one that drops patches.
    """
    kind = check_target(target)
    names = [layer.name for layer in backbone.layers]
    embedding = backbone.get_layer(configs.EMBEDDING)
    if cell_size(backbone) != embedding.patch_size:  # a ResNet stem before the patches
        raise ValueError("masked patch prediction needs a plain ViT: a hybrid's patches are "
                         "ResNet features, not pixels")
    if any(isinstance(layer, PatchDropout) for layer in backbone.layers):
        raise ValueError("masked patch prediction predicts every patch, and this backbone "
                         "drops patches in training: build it with patch_drop_rate=0")
    position = backbone.get_layer(configs.POSITION_EMBEDDING)
    images = keras.Input(backbone.input.shape[1:], name="images")
    sources = keras.Input((None,), dtype="int32", name="sources")
    masked = keras.Input((None,), dtype="bool", name="masked")
    x = embedding(images)
    x = MaskedPatchCorruption(name="mpp_corruption")(x, sources=sources, masked=masked)
    start = names.index(configs.EMBEDDING) + 1
    last = final_norm(backbone) or blocks_of(backbone)[-1]
    for layer in backbone.layers[start:backbone.layers.index(last) + 1]:
        dynamic = layer is position and takes_any_size(backbone)
        x = layer(x, images=images) if dynamic else layer(x)
    _, patches = PatchTokens(num_prefix_tokens(backbone), cell_size(backbone), spatial=False,
                             name="mpp_patch_tokens")(x, images=images)
    outputs = (kind.outputs(color_channels) if kind.classification
               else (embedding.patch_size**2 * backbone.input.shape[-1],))
    x = keras.layers.Dense(math.prod(outputs), dtype="float32", name="mpp_head")(patches)
    if len(outputs) > 1:
        x = keras.layers.Reshape((-1, *outputs), name="mpp_outputs")(x)
    return keras.Model({"images": images, "sources": sources, "masked": masked}, x,
                       name=f"{backbone.name}_mpp")


def compile_masked_patch_model(model: keras.Model, recipe: training.Recipe, total_steps: int,
                               learning_rate: float | None = None, jit_compile="auto",
                               steps_per_execution: int = 1, *,
                               target: str = "mean_color") -> keras.Model:
    """training.compile_model for this objective (training.train(compile=...)): the recipe's
    optimizer; cross-entropy over the classes (L2 for "pixels") counted on the corrupted
    patches only (the pipeline's weights), and accuracy likewise for the classes.

    Args:
        model: a masked_patch_model.
        recipe: the training recipe (its optimizer and schedule).
        total_steps: the training steps, for the schedule.
        learning_rate: overrides the recipe's peak learning rate.
        jit_compile: as keras.Model.compile's.
        steps_per_execution: as keras.Model.compile's.
        target: the model's target, a name in TARGETS.

    Returns:
        The compiled model.
    """
    kind = check_target(target)
    if kind.classification:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    else:
        loss, metrics = keras.losses.MeanSquaredError(), []
    model.compile(optimizer=training.make_optimizer(recipe, model, total_steps, learning_rate),
                  loss=loss, weighted_metrics=metrics, jit_compile=jit_compile,
                  steps_per_execution=steps_per_execution)
    return portable_jit_compile(training.save_public_optimizer(model))
