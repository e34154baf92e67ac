"""Masked patch prediction (vit_keras.masked): the corruption's statistics, the targets
against NumPy, the [mask] embedding learning, and a loss that falls."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import vit_keras as vk
from tests.conftest import TINY, randomize
from vit_keras import masked, training


def draw(batch=64, count=196, rate=0.5, seed=(0, 0)):
    return [t.numpy() for t in masked.draw_corruption(batch, count, rate,
                                                      tf.constant(seed, tf.int64))]


@pytest.mark.parametrize("rate", [0.5, 0.15])
def test_corruption_selects_the_rate_and_splits_80_10_10(rate):
    selected, sources, mask = draw(rate=rate)
    assert (selected.sum(axis=1) == round(rate * 196)).all()
    own = np.arange(196)[None]
    replaced = sources != own
    assert not (mask & ~selected).any() and not (replaced & ~selected).any()
    assert not (mask & replaced).any()
    total = selected.sum()
    assert abs(mask.sum() / total - 0.8) < 0.02
    assert abs(replaced.sum() / total - 0.1) < 0.015
    assert abs((selected & ~mask & ~replaced).sum() / total - 0.1) < 0.015
    # the random replacement is another patch, anywhere in the image
    assert len(np.unique(sources[replaced] - own.repeat(64, 0)[replaced])) > 100


def test_corruption_is_deterministic_for_a_seed():
    first, again, other = draw(seed=(3, 1)), draw(seed=(3, 1)), draw(seed=(4, 1))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (first[0] != other[0]).any()


def unit_images(batch=3, size=8, channels=3, seed=0):
    return np.random.default_rng(seed).uniform(0, 1, (batch, size, size, channels))


def numpy_patches(images, patch):
    b, h, w, c = images.shape
    x = images.reshape(b, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, -1, patch, patch, c)


def numpy_color_class(colors):
    """3 bits per channel, the first channel most significant."""
    levels = np.minimum((colors * 8).astype(int), 7)
    return sum(levels[..., c] * 8 ** (colors.shape[-1] - 1 - c) for c in range(colors.shape[-1]))


def targets(name, images, patch, channels):
    patches = masked.image_patches(tf.constant(images, tf.float32), patch)
    return masked.TARGETS[name].make(patches, channels).numpy()


def test_targets_equal_numpy():
    images = unit_images()
    patches = numpy_patches(images, 4)                                    # (3, 4, 4, 4, 3)
    np.testing.assert_array_equal(targets("mean_color", images, 4, 3),
                                  numpy_color_class(patches.mean(axis=(2, 3))))
    gray = np.repeat(images[..., :1], 3, axis=-1)
    np.testing.assert_array_equal(targets("mean_color", gray, 4, 1),
                                  numpy_color_class(numpy_patches(gray, 4)[..., :1]
                                                    .mean(axis=(2, 3))))
    assert targets("mean_color", gray, 4, 1).max() < 8
    big = unit_images(size=16)
    cells = numpy_patches(big, 8).reshape(3, 4, 4, 2, 4, 2, 3).mean(axis=(3, 5))
    np.testing.assert_array_equal(targets("downsized", big, 8, 3),
                                  numpy_color_class(cells).reshape(3, 4, 16))
    np.testing.assert_allclose(targets("pixels", images, 4, 3),
                               (patches * 2 - 1).reshape(3, 4, 48), atol=1e-6)


def test_pipeline_gives_inputs_targets_and_weights_on_the_corrupted_patches():
    images = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    batches = tf.data.Dataset.from_tensor_slices((images, np.zeros(8))).batch(4)
    inputs, target, weights = next(iter(masked.masked_patch_pipeline(batches, 8, seed=5)))
    assert set(inputs) == {"images", "sources", "masked"}
    assert target.shape == (4, 16) and weights.shape == (4, 16)
    assert (weights.numpy().sum(axis=1) == 8).all()
    assert not (inputs["masked"].numpy() & (weights.numpy() == 0)).any()
    # the targets are the uncorrupted [-1, 1] images' patches, rescaled to [0, 1] for the colours
    expected = numpy_color_class(numpy_patches((images[:4] + 1) / 2, 8).mean(axis=(2, 3)))
    np.testing.assert_array_equal(target.numpy(), expected)
    with pytest.raises(ValueError, match="patch size 6 is not a multiple of 4"):
        masked.masked_patch_pipeline(batches, 6, target="downsized")
    with pytest.raises(ValueError, match="unknown masked-patch target 'edges'"):
        masked.masked_patch_pipeline(batches, 8, target="edges")


def test_corruption_layer_replaces_tokens_as_drawn():
    layer = masked.MaskedPatchCorruption()
    tokens = np.arange(2 * 4 * 3, dtype="float32").reshape(2, 4, 3)
    sources = np.array([[0, 3, 2, 3], [1, 1, 2, 3]])
    mask = np.array([[False, False, True, False], [True, False, False, False]])
    out = keras.ops.convert_to_numpy(layer(tokens, sources=sources, masked=mask))
    token = keras.ops.convert_to_numpy(layer.mask_embedding)[0, 0]
    expected = np.take_along_axis(tokens, sources[..., None], axis=1)
    expected[mask] = token
    np.testing.assert_array_equal(out, expected)


def flat_images(count=64, seed=0):
    """Images of 4 patches in one flat colour of a palette of 8: a corrupted patch's colour
    is its neighbours'."""
    rng = np.random.default_rng(seed)
    palette = rng.uniform(-1, 1, (8, 3))
    colours = palette[rng.integers(0, 8, count)]
    images = np.broadcast_to(colours[:, None, None, :], (count, 16, 16, 3)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((images, np.zeros(count))).batch(16)


@pytest.mark.parametrize("target", ["mean_color", "pixels"])
def test_training_lowers_the_loss_and_teaches_the_mask_embedding(target):
    backbone = vk.vit(TINY, image_size=16, num_classes=3)
    model = masked.masked_patch_model(backbone, target)
    recipe = training.Recipe("adamw", 3e-3, "cosine", 0, clipnorm=None)
    masked.compile_masked_patch_model(model, recipe, 12 * 4, target=target)
    data = masked.masked_patch_pipeline(flat_images(), 8, target, seed=1)
    mask_before = keras.ops.convert_to_numpy(model.get_layer("mpp_corruption").mask_embedding)
    kernel_before = keras.ops.convert_to_numpy(backbone.get_layer("embedding").kernel)
    history = model.fit(data, epochs=12, verbose=0, shuffle=False).history["loss"]
    assert history[-1] < 0.5 * history[0], history
    mask_after = keras.ops.convert_to_numpy(model.get_layer("mpp_corruption").mask_embedding)
    assert np.abs(mask_after - mask_before).max() > 1e-3
    # the backbone itself learned: its weights are the model's
    assert np.abs(keras.ops.convert_to_numpy(backbone.get_layer("embedding").kernel)
                  - kernel_before).max() > 1e-3


def test_downsized_head_predicts_16_cells_and_hybrids_and_patch_dropout_are_refused():
    model = masked.masked_patch_model(randomize(vk.vit(TINY, image_size=16)), "downsized")
    assert tuple(model.output.shape) == (None, 4, 16, 512)
    hybrid = vk.vit({**TINY, "patch_size": 1, "resnet_layers": (), "resnet_width": 32},
                    image_size=16)
    with pytest.raises(ValueError, match="needs a plain ViT"):
        masked.masked_patch_model(hybrid)
    dropping = vk.vit(TINY, image_size=16, patch_drop_rate=0.5)
    with pytest.raises(ValueError, match="predicts every patch, and this backbone drops "
                                         "patches in training: build it with patch_drop_rate=0"):
        masked.masked_patch_model(dropping)
