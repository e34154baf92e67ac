"""Images of any size (vit(dynamic_image_size=True)) and features from any block
(vit_keras.intermediates), against fixed-size models and the NumPy reference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import vit_keras as vk
from tests import numpy_vit
from tests.conftest import TINY, checkpoint_params, images, randomize
from vit_keras.intermediates import features
from vit_keras.position_embeddings import resampling_matrix
from vit_keras.weights.resample import resample_grid

HYBRID = {**TINY, "patch_size": 1, "resnet_layers": (1,), "resnet_width": 32}
POSEMBS = ["learned", "learned2d", "sincos2d", "none"]


def numpy_of(x):
    return keras.ops.convert_to_numpy(x)


def dynamic_and_fixed(config=TINY, image_size=32, **kwargs):
    """A random dynamic-size model and a fixed-size one with the same weights."""
    dynamic = randomize(vk.vit(config, image_size=image_size, num_classes=5,
                               dynamic_image_size=True, **kwargs))
    fixed = vk.vit(config, image_size=image_size, num_classes=5, **kwargs)
    fixed.set_weights(dynamic.get_weights())
    return dynamic, fixed


@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("posemb", POSEMBS)
def test_dynamic_model_at_its_built_size_is_the_fixed_model(posemb, classifier):
    dynamic, fixed = dynamic_and_fixed(posemb=posemb, classifier=classifier)
    assert tuple(dynamic.input.shape) == (None, None, None, 3)
    x = images()
    np.testing.assert_allclose(numpy_of(dynamic(x)), numpy_of(fixed(x)), atol=1e-5)


@pytest.mark.parametrize("config, posemb, classifier", [
    *[(TINY, posemb, "token") for posemb in POSEMBS], (TINY, "learned", "gap"),
    (HYBRID, "learned", "token")])
def test_other_size_equals_a_fixed_model_loaded_with_resampled_embeddings(
        config, posemb, classifier, tmp_path):
    """Also: every kind of position embedding survives a change of resolution, from .npz and
    from .keras files (vk.load_weights resamples both)."""
    dynamic, _ = dynamic_and_fixed(config, posemb=posemb, classifier=classifier)
    vk.save_npz(dynamic, tmp_path / "weights.npz")
    dynamic.save(tmp_path / "model.keras")
    # (16, 64): a 2x8 grid, as many patches as the built 4x4 one, resampled all the same
    for size, file in [((48, 40), "weights.npz"), ((16, 24), "model.keras"),
                       ((64, 64), "model.keras"), ((16, 64), "weights.npz")]:
        fixed = vk.vit(config, image_size=size, num_classes=5, posemb=posemb,
                       classifier=classifier)
        report = vk.load_weights(fixed, str(tmp_path / file))
        assert report.unused == [] and report.reinitialised == []
        x = images(height=size[0], width=size[1])
        np.testing.assert_allclose(numpy_of(dynamic(x)), numpy_of(fixed(x)), atol=1e-4)


@pytest.mark.parametrize("method", ["zoom", "bilinear"])
def test_in_model_resampling_is_the_load_time_algorithm(method):
    table = np.random.default_rng(0).normal(size=(5, 3, 4)).astype("float32")
    for new in [(7, 2), (3, 3), (1, 6), (5, 3)]:
        rows, cols = (numpy_of(resampling_matrix(old, n, method))
                      for old, n in zip(table.shape[:2], new, strict=True))
        np.testing.assert_allclose(np.einsum("ia,abd,jb->ijd", rows, table, cols),
                                   resample_grid(table, new, method), atol=1e-6)


def test_sizes_that_do_not_fill_whole_patches_are_refused():
    model = vk.vit(TINY, image_size=32, num_classes=3, dynamic_image_size=True)
    with pytest.raises(ValueError, match="images of 36x32 pixels do not divide into the "
                                         "model's 8x8-pixel patches: expected multiples of 8"):
        model(images(height=36, width=32))


def test_keras_file_of_a_dynamic_model_round_trips_in_safe_mode(tmp_path):
    model, _ = dynamic_and_fixed(posemb="learned2d")
    model.save(tmp_path / "dynamic.keras")
    loaded = keras.saving.load_model(tmp_path / "dynamic.keras", safe_mode=True)
    x = images(height=40, width=24)
    np.testing.assert_allclose(numpy_of(loaded(x)), numpy_of(model(x)), atol=1e-6)


def batches(size, count=2):
    rng = np.random.default_rng(size)
    x = rng.uniform(-1, 1, (4 * count, size, size, 3)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 5, 4 * count))).batch(4)


def test_fit_takes_batches_of_two_sizes_and_trains_through_the_resampling():
    model, _ = dynamic_and_fixed()
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(batches(32).concatenate(batches(48)), epochs=2, verbose=0,
                        shuffle=False)
    assert np.all(np.isfinite(history.history["loss"]))
    # Only at 48 px the table is reached through the resampling: it must still learn.
    posemb = model.get_layer("Transformer_posembed_input").pos_embedding
    before = numpy_of(posemb)
    model.fit(batches(48), epochs=1, verbose=0, shuffle=False)
    assert np.abs(numpy_of(posemb) - before).max() > 1e-4


# --------------------------------------------------------------------------- features


def reference_blocks(model, x, classifier, depth, representation=False):
    """The raw weights, the block outputs and the representation of the NumPy forward pass."""
    params = checkpoint_params(model)
    _, blocks, pooled = numpy_vit.forward(
        params, x, patch=8, heads=4, layers=depth, classifier=classifier,
        posemb=params["Transformer/posembed_input/pos_embedding"][0],
        representation=representation, return_blocks=True)
    return params, blocks, pooled


@pytest.mark.parity
@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_features_are_the_numpy_forward_pass_block_by_block(classifier):
    model = randomize(vk.vit({**TINY, "num_layers": 3}, image_size=(32, 48), num_classes=5,
                             classifier=classifier, representation_size=16))
    x = images(height=32, width=48)
    params, blocks, pooled = reference_blocks(model, x, classifier, 3, representation=True)
    prefix = 1 if classifier == "token" else 0
    for norm in (False, True):
        extract = features(model, blocks=[0, -1], norm=norm, prefix_tokens=True, pooled=True)
        out = {k: numpy_of(v) for k, v in extract(x).items()}
        expected_keys = {"block0", "block2", "pooled"} | (
            {"block0_prefix", "block2_prefix"} if prefix else set())
        assert set(out) == expected_keys
        for index in (0, 2):
            tokens = blocks[index]
            if norm:
                tokens = numpy_vit.layer_norm(tokens, params["Transformer/encoder_norm/scale"],
                                              params["Transformer/encoder_norm/bias"])
            np.testing.assert_allclose(out[f"block{index}"],
                                       tokens[:, prefix:].reshape(2, 4, 6, 32), atol=1e-5)
            if prefix:
                np.testing.assert_allclose(out[f"block{index}_prefix"], tokens[:, :1],
                                           atol=1e-5)
        np.testing.assert_allclose(out["pooled"], pooled, atol=1e-5)


def test_last_blocks_as_sequences_and_bad_indices():
    model = randomize(vk.vit({**TINY, "num_layers": 3}, image_size=32, num_classes=5))
    x = images()
    _, blocks, _ = reference_blocks(model, x, "token", 3)
    out = features(model, blocks=2, spatial=False, norm=False)(x)
    assert sorted(out) == ["block1", "block2"]
    for index in (1, 2):
        np.testing.assert_allclose(numpy_of(out[f"block{index}"]), blocks[index][:, 1:],
                                   atol=1e-5)
    with pytest.raises(ValueError, match=r"block 2 is asked for twice in blocks=\[2, -1\]"):
        features(model, blocks=[2, -1])
    with pytest.raises(ValueError, match="block index -4 is out of range for a model of 3 "
                                         "blocks: expected -3 to 2"):
        features(model, blocks=[-4])
    with pytest.raises(ValueError, match=r"blocks=5: expected 1 to 3"):
        features(model, blocks=5)


def test_features_follow_the_image_size_of_a_dynamic_model(tmp_path):
    model, _ = dynamic_and_fixed()
    extract = features(model, blocks=1, norm=True, prefix_tokens=True)
    vk.save_npz(model, tmp_path / "weights.npz")
    fixed = vk.vit(TINY, image_size=(48, 24), num_classes=5)
    vk.load_npz(fixed, tmp_path / "weights.npz", resample="zoom")
    expected = features(fixed, blocks=1, norm=True, prefix_tokens=True)
    x = images(height=48, width=24)
    got, want = extract(x), expected(x)
    assert tuple(got["block1"].shape) == (2, 6, 3, 32)
    for key in ("block1", "block1_prefix"):
        np.testing.assert_allclose(numpy_of(got[key]), numpy_of(want[key]), atol=1e-4)


def test_feature_model_round_trips_as_a_keras_file(tmp_path):
    model, _ = dynamic_and_fixed()
    extract = features(model, blocks=[0, 1], norm=True, prefix_tokens=True, pooled=True)
    extract.save(tmp_path / "features.keras")
    loaded = keras.saving.load_model(tmp_path / "features.keras", safe_mode=True)
    x = images(height=40, width=40)
    for key, value in extract(x).items():
        np.testing.assert_allclose(numpy_of(loaded(x)[key]), numpy_of(value), atol=1e-6)


def test_features_of_a_vit_nested_in_a_bigger_model():
    vit = randomize(vk.vit(TINY, image_size=32, num_classes=5))
    inputs = keras.Input((32, 32, 3))
    rescaled = keras.Model(inputs, keras.layers.Dense(2)(vit(keras.layers.Rescaling(0.5)(
        inputs))))
    sequential = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(0.5), vit])
    direct_input = keras.Input((32, 32, 3))
    plain = keras.Model(direct_input, keras.layers.Dense(2)(vit(direct_input)))
    x = images()
    direct = numpy_of(features(vit, blocks=1)(x * 0.5)["block1"])
    for outer in (rescaled, sequential):
        np.testing.assert_allclose(numpy_of(features(outer, blocks=1)(x)["block1"]), direct,
                                   atol=1e-6)
    np.testing.assert_allclose(numpy_of(features(plain, blocks=1)(x * 0.5)["block1"]), direct,
                               atol=1e-6)
