import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import timm
import torch
from keras import ops

import vit_keras as vk
from tests import numpy_vit
from tests.conftest import (
    TINY,
    backend_independent,
    checkpoint_params,
    images,
    randomize,
    randomize_layer,
)
from vit_keras import kernels

# vit-facts.md section 2: exact counts at 224 px with a 1000-class head (models_test.py).
OFFICIAL_PARAMS = {
    "Ti/16": 5_717_416, "S/16": 22_050_664, "S/32": 22_878_952, "B/16": 86_567_656,
    "B/32": 88_224_232, "B/8": 86_576_872, "L/16": 304_326_632, "L/32": 306_535_400,
    "H/14": 632_045_800,
}


@backend_independent  # the variables' shapes, the same on every backend
@pytest.mark.parametrize("variant", sorted(OFFICIAL_PARAMS))
def test_parameter_counts_match_official(variant):
    assert vk.vit(variant).count_params() == OFFICIAL_PARAMS[variant]


# The hybrids, from the same models_test.py.
HYBRID_PARAMS = {"R+Ti/16": 6_337_704, "R26+S/32": 36_431_912, "R26+B/32": 101_383_976,
                 "R50+B/16": 98_659_112, "R50+L/32": 328_994_856}


@backend_independent
@pytest.mark.parametrize("variant", sorted(HYBRID_PARAMS))
def test_hybrid_parameter_counts_match_official(variant):
    assert vk.vit(variant).count_params() == HYBRID_PARAMS[variant]


@pytest.mark.parity
@pytest.mark.parametrize("stages, patch", [((1, 2), 1), ((), 2)])
def test_hybrid_forward_equals_numpy_resnet_and_transformer(stages, patch):
    # 32x48 makes SAME padding asymmetric in the strided convolutions and the max-pool.
    config = {**TINY, "patch_size": patch, "resnet_layers": stages, "resnet_width": 32}
    model = randomize(vk.vit(config, image_size=(32, 48), num_classes=5))
    params = checkpoint_params(model)
    x = images(height=32, width=48)
    expected = numpy_vit.forward(
        params, x, patch=patch, heads=4, layers=2, resnet_stages=stages, resnet_width=32,
        posemb=params["Transformer/posembed_input/pos_embedding"][0])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), expected, atol=2e-4)


def test_hybrid_keras_file_round_trips_in_safe_mode(tmp_path):
    config = {**TINY, "patch_size": 1, "resnet_layers": (1, 1), "resnet_width": 32}
    model = randomize(vk.vit(config, image_size=32, num_classes=3))
    model.save(tmp_path / "hybrid.keras")
    loaded = keras.saving.load_model(tmp_path / "hybrid.keras", safe_mode=True)
    x = images()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)),
                               keras.ops.convert_to_numpy(model(x)), atol=1e-6)


def test_hybrid_image_size_must_fill_whole_cells():
    with pytest.raises(ValueError, match="200x200 is not divisible by the hybrid's 16-pixel "
                                         r"cells \(ResNet stride 16 x patch size 1\)"):
        vk.vit("R50+B/16", image_size=200)


def reference_posemb(model, posemb, classifier, grid):
    """The table the paper adds, built in the test from the model's raw weights."""
    params = checkpoint_params(model)
    d = TINY["hidden_size"]
    prefix = 1 if classifier == "token" else 0
    if posemb == "learned":
        return params["Transformer/posembed_input/pos_embedding"][0]
    if posemb == "sincos2d":
        return np.concatenate([np.zeros((prefix, d)), numpy_vit.sincos2d(*grid, d)])
    if posemb == "learned2d":
        rows = params["Transformer/posembed_input/row_embedding"]
        cols = params["Transformer/posembed_input/col_embedding"]
        table = [np.concatenate([rows[i], cols[j]]) for i in range(grid[0])
                 for j in range(grid[1])]
        head = [params["Transformer/posembed_input/prefix_embedding"][0]] if prefix else []
        return np.array(head + table)
    return None


@pytest.mark.parity
@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("posemb", ["learned", "sincos2d", "learned2d", "none"])
def test_forward_equals_numpy_paper_equations(classifier, posemb):
    model = randomize(vk.vit(TINY, image_size=32, num_classes=7, classifier=classifier,
                             posemb=posemb, representation_size=16))
    x = images()
    expected = numpy_vit.forward(
        checkpoint_params(model), x, patch=8, heads=4, layers=2, classifier=classifier,
        posemb=reference_posemb(model, posemb, classifier, (4, 4)), representation=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), expected, atol=1e-5)


@pytest.mark.parametrize("approximate", [True, False])
def test_rectangular_images_and_gelu_choice(approximate):
    model = randomize(vk.vit(TINY, image_size=(32, 48), num_classes=3,
                             approximate_gelu=approximate))
    x = images(height=32, width=48)
    expected = numpy_vit.forward(
        checkpoint_params(model), x, patch=8, heads=4, layers=2,
        posemb=checkpoint_params(model)["Transformer/posembed_input/pos_embedding"][0],
        approximate=approximate)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), expected, atol=1e-5)


def test_head_starts_at_zero_and_include_top_false_gives_features():
    model = vk.vit(TINY, image_size=32, num_classes=4, head_bias_init=-10.0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images())),
                                  np.full((2, 4), -10.0))
    features = vk.vit(TINY, image_size=32, include_top=False, representation_size=24)
    assert tuple(features.output.shape) == (None, 24)
    assert "head" not in [layer.name for layer in features.layers]


def test_attention_probabilities_come_from_the_same_block():
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3))
    x = images()
    _, expected = numpy_vit.forward(
        checkpoint_params(model), x, patch=8, heads=4, layers=2,
        posemb=checkpoint_params(model)["Transformer/posembed_input/pos_embedding"][0],
        return_attention=True)
    tokens = x
    for name in ("embedding", "cls", "Transformer_posembed_input"):
        tokens = model.get_layer(name)(tokens)
    block = model.get_layer("Transformer_encoderblock_0")
    out, probs = block(tokens, return_attention_scores=True)
    assert tuple(probs.shape) == (2, 4, 17, 17)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(probs), expected[0], atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out),
                               keras.ops.convert_to_numpy(block(tokens)), atol=1e-6)


@pytest.mark.parametrize("tokens_known", [True, False])
def test_fused_attention_equals_the_einsum_kernel(tokens_known):
    """The two attention kernels give the same block output on every backend, also traced
    with the batch and token count unknown (TensorFlow's tf.function with a None shape)."""
    if not tokens_known and keras.backend.backend() != "tensorflow":
        pytest.skip("unknown shapes are traced by TensorFlow's tf.function only")
    tokens = np.random.default_rng(2).normal(size=(2, 17, 32)).astype("float32")
    outputs = []
    for kernel in ("fused", "einsum"):
        block = randomize_layer(vk.layers.MultiHeadDotProductAttention(
            num_heads=4, attention_kernel=kernel), (2, 17, 32))
        if not tokens_known:
            import tensorflow as tf

            call = tf.function(block, input_signature=[tf.TensorSpec((None, None, 32))])
            outputs.append(call(tokens))
        else:
            outputs.append(block(tokens))
    np.testing.assert_allclose(*map(keras.ops.convert_to_numpy, outputs), atol=1e-5)
    assert np.abs(keras.ops.convert_to_numpy(outputs[0])).max() > 0.1


def test_unknown_attention_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown attention kernel 'flash': expected one of "
                                         "auto, fused, einsum"):
        vk.vit(TINY, image_size=32, attention_kernel="flash")


def test_stochastic_depth_rises_linearly_and_drops_whole_samples():
    model = vk.vit({**TINY, "num_layers": 5}, image_size=32, stochastic_depth_rate=0.2)
    rates = [model.get_layer(f"Transformer_encoderblock_{i}").drop_path_rate for i in range(5)]
    np.testing.assert_allclose(rates, [0.0, 0.05, 0.1, 0.15, 0.2])
    block = vk.layers.TransformerBlock(num_heads=4, mlp_dim=64, drop_path_rate=0.25, seed=3)
    branch = keras.ops.ones((4000, 3, 2))
    kept = keras.ops.convert_to_numpy(branch * block._drop_path_scale(branch, training=True))
    per_sample = kept.reshape(4000, -1)
    dropped = per_sample == 0
    np.testing.assert_allclose(per_sample[~dropped], 1 / 0.75, rtol=1e-6)
    assert np.all(per_sample.min(axis=1) == per_sample.max(axis=1))  # whole samples
    assert abs(dropped[:, 0].mean() - 0.25) < 0.03
    assert block._drop_path_scale(branch, training=False) is None  # the branch as it is
    # in the block: a sample whose two branches are both dropped (a quarter at rate 0.5)
    # leaves it as it came, the others do not
    tokens = np.random.default_rng(2).normal(size=(400, 5, 32)).astype("float32")
    block = randomize_layer(vk.layers.TransformerBlock(num_heads=4, mlp_dim=64,
                                                       drop_path_rate=0.5, seed=3), (400, 5, 32))
    unchanged = np.all(np.isclose(keras.ops.convert_to_numpy(block(tokens, training=True)),
                                  tokens, atol=1e-6), axis=(1, 2))
    assert 0.15 < unchanged.mean() < 0.35, unchanged.mean()


def test_dropout_only_in_training():
    model = randomize(vk.vit(TINY, image_size=32, dropout_rate=0.3, num_classes=3))
    x = images()
    plain = vk.vit(TINY, image_size=32, num_classes=3)
    plain.set_weights(model.get_weights())
    inference = keras.ops.convert_to_numpy(model(x, training=False))
    np.testing.assert_allclose(inference, keras.ops.convert_to_numpy(plain(x)), atol=1e-6)
    assert not np.allclose(keras.ops.convert_to_numpy(model(x, training=True)), inference)


def test_keras_file_round_trips_in_safe_mode(tmp_path):
    model = randomize(vk.vit(TINY, image_size=(32, 40), num_classes=5, posemb="learned2d",
                             classifier="gap", stochastic_depth_rate=0.1, dropout_rate=0.1))
    path = tmp_path / "tiny.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    x = images(height=32, width=40)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)),
                               keras.ops.convert_to_numpy(model(x)), atol=1e-6)
    block = loaded.get_layer("Transformer_encoderblock_1")
    assert isinstance(block, vk.layers.TransformerBlock) and block.drop_path_rate == 0.1
    rebuilt = vk.layers.AddPositionEmbedding.from_config(
        model.get_layer("Transformer_posembed_input").get_config())
    assert (rebuilt.grid_size, rebuilt.kind, rebuilt.num_prefix_tokens) == ((4, 5), "learned2d", 0)


WORKER = """
from tests.conftest import TINY  # first: it imports torch before TensorFlow
import sys, numpy as np, vit_keras as vk, keras
model = vk.vit(TINY, image_size=32, num_classes=6, weights=sys.argv[1])
np.save(sys.argv[3], keras.ops.convert_to_numpy(model(np.load(sys.argv[2]))))
"""


@backend_independent
def test_same_weights_same_logits_on_every_backend(tmp_path):
    model = randomize(vk.vit(TINY, image_size=32, num_classes=6))
    model.save_weights(tmp_path / "w.weights.h5")
    np.save(tmp_path / "x.npy", images(batch=3))
    here = keras.ops.convert_to_numpy(model(images(batch=3)))
    others = {}  # side by side: each process's start-up is most of its time
    for backend in {"tensorflow", "jax", "torch"} - {keras.backend.backend()}:
        others[backend] = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path / "w.weights.h5"),
             str(tmp_path / "x.npy"), str(tmp_path / f"{backend}.npy")],
            env={**os.environ, "KERAS_BACKEND": backend}, stderr=subprocess.PIPE, text=True,
            cwd=os.path.dirname(os.path.dirname(__file__)))
    for backend, process in others.items():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, (backend, stderr[-2000:])
        np.testing.assert_allclose(np.load(tmp_path / f"{backend}.npy"), here, atol=1e-5,
                                   err_msg=backend)


def fitted_losses(**options) -> list[float]:
    """The per-epoch losses of a tiny ViT fitted to two classes of images told apart by
    their brightness."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 64).astype("int32")
    x = (rng.uniform(-1, 1, (64, 16, 16, 3)) * 0.5 + np.where(y, 0.4, -0.4)[:, None, None, None])
    model = vk.vit({**TINY, "patch_size": 4}, image_size=16, num_classes=2, **options)
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model.fit(x.astype("float32"), y, batch_size=16, epochs=8, verbose=0).history["loss"]


def test_fit_lowers_loss():
    history = fitted_losses()
    assert history[-1] < 0.5 * history[0], history


def test_mixed_bfloat16_trains_and_returns_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = vk.vit(TINY, image_size=32, num_classes=3)
    assert model.get_layer("Transformer_encoderblock_0").compute_dtype == "bfloat16"
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    model.fit(images(batch=4), np.array([0, 1, 2, 0]), epochs=1, verbose=0)
    after = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    assert all(w.dtype == np.float32 for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert keras.backend.standardize_dtype(model(images()).dtype) == "float32"


def test_gelu_option_holds_under_mixed_bfloat16():
    """approximate_gelu picks the GELU in every precision: under mixed_bfloat16 the MLP's
    output is, bit for bit, Dense -> the chosen GELU -> Dense composed by hand in bfloat16, and
    differs from the composition with the other GELU."""
    keras.config.set_dtype_policy("mixed_bfloat16")  # the conftest fixture sets float32 back
    x = np.random.default_rng(0).normal(0, 1, (4, 17, 32)).astype("float32")

    def by_hand(mlp, approximate):
        def dense(h, layer):
            return (ops.matmul(h, ops.cast(layer.kernel, "bfloat16"))
                    + ops.cast(layer.bias, "bfloat16"))

        hidden = ops.gelu(dense(ops.cast(x, "bfloat16"), mlp.dense_0), approximate=approximate)
        return ops.convert_to_numpy(ops.cast(dense(hidden, mlp.dense_1), "float32"))

    for approximate in (True, False):
        mlp = randomize_layer(vk.layers.MlpBlock(64, approximate_gelu=approximate),
                              (None, 17, 32), scale=1.0)
        out = ops.convert_to_numpy(ops.cast(mlp(x), "float32"))
        np.testing.assert_array_equal(out, by_hand(mlp, approximate))
        assert not np.array_equal(out, by_hand(mlp, not approximate))


def test_int8_quantized_mlp_computes_with_its_quantized_kernels():
    """model.quantize("int8") swaps the MLP's Dense kernels for int8 ones and scales, and the
    model computes with them."""
    model = randomize(vk.vit(TINY, image_size=32, num_classes=10))
    x = images(batch=4)
    expected = keras.ops.convert_to_numpy(model(x))
    model.quantize("int8")
    dense = model.get_layer("Transformer_encoderblock_0").mlp.dense_0
    assert keras.backend.standardize_dtype(dense.kernel.dtype) == "int8"
    error = np.abs(keras.ops.convert_to_numpy(model(x)) - expected).max()
    assert 0 < error < 0.05 * np.abs(expected).max(), (error, np.abs(expected).max())


@pytest.mark.parametrize("kwargs, message", [
    (dict(image_size=36), "image_size 36 is not divisible by patch size 8"),
    (dict(image_size=(32, 30)), "image_size 30 is not divisible by patch size 8"),
    (dict(variant="Z/16"), r"unknown variant 'Z/16'.*known variants: Ti/16"),
    (dict(classifier="map"), "unknown classifier 'map': expected one of token, gap"),
    (dict(posemb="rotary"), "unknown position embedding 'rotary': expected one of learned"),
    (dict(variant={**TINY, "num_heads": 3}), "num_heads 3 does not divide hidden_size 32"),
    (dict(dropout_rate=1.5), r"dropout_rate must be in \[0, 1\), got 1.5"),
    (dict(num_classes=0), "num_classes must be a positive int, got 0"),
    (dict(image_size=(32,)), r"image_size must be a positive int or \(height, width\)"),
])
def test_bad_arguments_name_what_was_expected(kwargs, message):
    kwargs = {"variant": TINY, "image_size": 32, **kwargs}
    with pytest.raises(ValueError, match=message):
        vk.vit(**kwargs)


def test_wrong_input_rank_and_size_are_refused():
    model = vk.vit(TINY, image_size=32, num_classes=3)
    with pytest.raises(ValueError, match=r"expected.*\(None, 32, 32, 3\)|\(None, 32, 32, 3\)"):
        model(images()[0])
    with pytest.raises(ValueError, match=r"32, 32, 3"):
        model(images(height=40, width=40))
    with pytest.raises(ValueError, match=r"expects images of rank 4 .* got shape \(32, 32, 3\)"):
        vk.layers.PatchEmbedding(8, 32).build((32, 32, 3))


def test_preprocess_maps_uint8_to_unit_interval():
    pixels = np.array([[0, 127, 128, 255]], dtype=np.uint8)
    out = keras.ops.convert_to_numpy(vk.preprocess(pixels))
    np.testing.assert_allclose(out, (pixels.astype(np.float64) - 127.5) / 127.5, atol=1e-7)
    assert out.dtype == np.float32


@pytest.mark.parametrize("kwargs, message", [
    (dict(class_token=False), "classifier='token' reads the class token: it needs "
                              "class_token=True"),
    (dict(distilled=True, classifier="gap"), r"distilled=True \(DeiT\) needs the class token "
                                             "and classifier='token'"),
    (dict(distilled=True, fc_norm=True), r"distilled=True \(DeiT\) has neither fc_norm"),
    (dict(mlp_activation="relu"), "unknown mlp_activation 'relu': expected one of gelu, "
                                  "quick_gelu"),
    (dict(num_register_tokens=-1), "num_register_tokens must be an int >= 0, got -1"),
])
def test_family_options_refuse_combinations_no_family_has(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vk.vit(TINY, image_size=32, **kwargs)


def test_family_options_serialise_and_take_any_image_size(tmp_path):
    options = dict(qk_norm=True, pre_norm=True, mlp_activation="quick_gelu",
                   num_register_tokens=2, layer_norm_epsilon=1e-5, layer_scale=0.5,
                   dynamic_image_size=True)
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3, **options))
    model.save(tmp_path / "m.keras")
    restored = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    for height, width in ((32, 32), (48, 24)):
        x = images(height=height, width=width)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(restored(x)),
                                   keras.ops.convert_to_numpy(model(x)), atol=1e-6)
    block = restored.get_layer("Transformer_encoderblock_0").get_config()
    assert (block["qk_norm"], block["mlp_activation"], block["norm_epsilon"]) == (
        True, "quick_gelu", 1e-5)
    assert restored.get_layer("registers").num_tokens == 2
    assert not restored.get_layer("embedding").use_bias  # CLIP's patch embedding


@pytest.mark.parametrize("num_patches, num_prefix, rate", [(49, 0, 0.5), (16, 1, 0.25),
                                                          (16, 5, 0.9), (3, 1, 0.7)])
def test_patch_dropout_keeps_timms_count_of_distinct_patches_after_the_prefix(
        num_patches, num_prefix, rate):
    rng = np.random.default_rng(0)
    tokens = rng.normal(size=(6, num_prefix + num_patches, 8)).astype("float32")
    layer = vk.layers.PatchDropout(rate, num_prefix_tokens=num_prefix, seed=1)
    kept = keras.ops.convert_to_numpy(layer(tokens, training=True))
    timm_layer = timm.layers.PatchDropout(rate, num_prefix_tokens=num_prefix).train()
    assert kept.shape[1] == timm_layer(torch.from_numpy(tokens)).shape[1]
    np.testing.assert_array_equal(kept[:, :num_prefix], tokens[:, :num_prefix])
    subsets = []
    for image, image_tokens in zip(kept, tokens, strict=True):
        rows = [np.flatnonzero((image_tokens[num_prefix:] == row).all(axis=1)) for row in
                image[num_prefix:]]
        assert all(len(match) == 1 for match in rows)  # each kept token is one input patch
        subsets.append(tuple(sorted(int(match[0]) for match in rows)))
        assert len(set(subsets[-1])) == len(subsets[-1])  # no patch twice
    if kept.shape[1] - num_prefix < num_patches:
        assert len(set(subsets)) > 1  # each image draws its own patches
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(tokens)), tokens)
    layer.trainable = False  # a frozen backbone's
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer(tokens, training=True)), tokens)


def test_patch_dropout_repeats_with_its_seed_and_round_trips_in_safe_mode(tmp_path):
    tokens = np.random.default_rng(0).normal(size=(4, 17, 8)).astype("float32")
    first, second = (vk.layers.PatchDropout(0.5, num_prefix_tokens=1, seed=7) for _ in range(2))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(first(tokens, training=True)),
                                  keras.ops.convert_to_numpy(second(tokens, training=True)))
    model = randomize(vk.vit(TINY, image_size=32, num_classes=3, patch_drop_rate=0.5))
    plain = vk.vit(TINY, image_size=32, num_classes=3)
    plain.set_weights(model.get_weights())
    x = images()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)),
                               keras.ops.convert_to_numpy(plain(x)), atol=1e-6)
    assert not np.allclose(keras.ops.convert_to_numpy(model(x, training=True)),
                           keras.ops.convert_to_numpy(model(x)), atol=1e-3)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    layer = loaded.get_layer("patch_dropout")
    assert (layer.rate, layer.num_prefix_tokens) == (0.5, 1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)),
                               keras.ops.convert_to_numpy(model(x)), atol=1e-6)


def test_fit_with_patch_dropout_lowers_loss_and_refuses_a_whole_drop():
    history = fitted_losses(classifier="gap", patch_drop_rate=0.5)
    assert history[-1] < 0.5 * history[0], history
    with pytest.raises(ValueError, match=r"patch_drop_rate must be in \[0, 1\), got 1.0"):
        vk.vit(TINY, image_size=32, patch_drop_rate=1.0)


def general_path_block_output(block, tokens, monkeypatch):
    """The block's output with the fast paths off (VIT_KERAS_FAST_PATHS=0): its sublayers
    called as Keras layers."""
    with monkeypatch.context() as patch:
        patch.setattr(kernels, "FAST_PATHS_ON", False)
        assert not block.attention.takes_direct_path() and not block.mlp.takes_direct_path()
        return keras.ops.convert_to_numpy(
            keras.ops.cast(block(tokens, training=False), "float32"))


@pytest.mark.parity
@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="the direct path runs on PyTorch only (kernels.FAST_PATHS)")
@pytest.mark.parametrize("policy, atol", [("float32", 1e-5), ("mixed_bfloat16", 3e-2)])
@pytest.mark.parametrize("options", [
    {}, dict(layer_scale=0.5, qkv_bias=False, proj_bias=False, mlp_activation="quick_gelu",
             attention_kernel="einsum")])
def test_block_direct_path_equals_its_general_path(policy, atol, options, monkeypatch):
    """The direct path (sublayers' variables through vit_keras.kernels, no Keras calls) gives
    the general path's numbers to the dtype's tolerance, and is the path taken by default
    where the switch leaves it on."""
    keras.config.set_dtype_policy(policy)
    try:
        block = randomize_layer(vk.layers.TransformerBlock(num_heads=4, mlp_dim=64, **options),
                                (2, 17, 32))
    finally:
        keras.config.set_dtype_policy("float32")
    on = kernels.FAST_PATHS_ON
    assert block.attention.takes_direct_path() is on and block.mlp.takes_direct_path() is on
    tokens = keras.ops.cast(np.random.default_rng(3).normal(size=(2, 17, 32)),
                            block.compute_dtype)
    direct = keras.ops.convert_to_numpy(keras.ops.cast(block(tokens), "float32"))
    general = general_path_block_output(block, tokens, monkeypatch)
    assert direct.dtype == general.dtype and np.abs(general - direct).max() <= atol, (
        np.abs(general - direct).max())
    assert np.abs(direct - keras.ops.convert_to_numpy(keras.ops.cast(tokens, "float32"))
                  ).max() > 0.1


@pytest.mark.skipif(keras.backend.backend() != "torch" or not kernels.FAST_PATHS_ON,
                    reason="the direct path runs on PyTorch with the fast paths on")
def test_options_the_direct_path_cannot_serve_take_the_general_path():
    """Attention probabilities, attention dropout and dropout in training, qk_norm, LoRA and
    quantized kernels each send the sublayer that needs them to its Keras calls."""
    block = randomize_layer(vk.layers.TransformerBlock(
        num_heads=4, mlp_dim=64, dropout_rate=0.1, attention_dropout_rate=0.1), (2, 17, 32))
    assert block.attention.takes_direct_path(training=False)
    assert not block.attention.takes_direct_path(training=True)
    assert not block.attention.takes_direct_path(return_attention_scores=True)
    assert block.mlp.takes_direct_path(training=False)
    assert not block.mlp.takes_direct_path(training=True)
    qk = randomize_layer(vk.layers.TransformerBlock(num_heads=4, mlp_dim=64, qk_norm=True),
                         (2, 17, 32))
    assert not qk.attention.takes_direct_path() and qk.mlp.takes_direct_path()
    model = vk.lora(vk.vit(TINY, image_size=32, num_classes=3), rank=2, targets=("value",))
    lora_block = model.get_layer("Transformer_encoderblock_0")
    assert not lora_block.attention.takes_direct_path() and lora_block.mlp.takes_direct_path()
    model = vk.vit(TINY, image_size=32, num_classes=3)
    model.quantize("int8")
    quantized = model.get_layer("Transformer_encoderblock_0")
    assert not quantized.attention.takes_direct_path()
    assert not quantized.mlp.takes_direct_path()


def test_dropout_in_training_still_drops_on_the_general_path():
    """With dropout the training output is random and differs from inference; at rate 0
    training and inference agree (both on the direct path)."""
    tokens = np.random.default_rng(4).normal(size=(2, 17, 32)).astype("float32")
    for rates, differs in (((0.0, 0.0), False), ((0.5, 0.0), True), ((0.0, 0.5), True)):
        block = randomize_layer(vk.layers.TransformerBlock(
            num_heads=4, mlp_dim=64, dropout_rate=rates[0], attention_dropout_rate=rates[1],
            seed=1), (2, 17, 32))
        trained = keras.ops.convert_to_numpy(block(tokens, training=True))
        inferred = keras.ops.convert_to_numpy(block(tokens, training=False))
        assert (np.abs(trained - inferred).max() > 1e-3) == differs, rates
    # one branch silenced (its last projection zero): the other's dropout alone still drops
    for branch, projection in (("mlp", "dense_1"), ("attention", "out")):
        block = randomize_layer(vk.layers.TransformerBlock(
            num_heads=4, mlp_dim=64, dropout_rate=0.5, seed=1), (2, 17, 32))
        for weight in getattr(getattr(block, branch), projection).weights:
            weight.assign(np.zeros(weight.shape, "float32"))
        trained = keras.ops.convert_to_numpy(block(tokens, training=True))
        inferred = keras.ops.convert_to_numpy(block(tokens, training=False))
        assert np.abs(trained - inferred).max() > 1e-3, branch


def test_images_with_other_channels_than_the_model_are_one_line_naming_both():
    # Keras' own input check lets one channel through; the convolution's error came wrapped
    # in a dump of the arguments of every enclosing call.
    model = vk.vit(TINY, image_size=32, num_classes=3)
    gray = images()[..., :1]
    for run in (model, lambda x: model.predict(x, verbose=0)):
        with pytest.raises(ValueError) as error:
            run(gray)
        message = str(error.value)
        assert message.startswith("expected images with 3 channels, got 1 (images of shape (")
        assert "\n" not in message and "build the model with channels=1" in message
    one_channel = vk.vit(TINY, image_size=32, num_classes=3, channels=1)
    assert one_channel(gray).shape == (2, 3)


def test_include_preprocessing_takes_raw_pixels_as_vk_preprocess_scales_them(tmp_path):
    from vit_keras.export.serving import serving_model

    model = randomize(vk.vit(TINY, image_size=32, num_classes=3, include_preprocessing=True))
    plain = vk.vit(TINY, image_size=32, num_classes=3)
    plain.set_weights(model.get_weights())
    pixels = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype="uint8")
    expected = keras.ops.convert_to_numpy(plain(vk.preprocess(pixels)))
    for raw in (pixels, pixels.astype("float32")):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(model(raw)), expected, atol=1e-6)
    model.save(tmp_path / "raw.keras")
    loaded = keras.saving.load_model(tmp_path / "raw.keras", safe_mode=True)
    np.testing.assert_allclose(loaded.predict(pixels, verbose=0), expected, atol=1e-6)
    # The uint8 serving function of the exports and vit-keras predict scales only once.
    served = serving_model(loaded)(pixels)["logits"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(served), expected, atol=1e-6)


@pytest.mark.parametrize("size", [(9, 12), (16, 16)])
@pytest.mark.parametrize("pool, strides", [(3, 2), (2, 1), (2, 3)])
@pytest.mark.parametrize("channels", [64, 128])
def test_resnet_norm_and_pool_equal_keras_layers_values_and_gradients(size, pool, strides,
                                                                      channels):
    # The hybrids' GroupNorm and MaxPool take kernels' direct path on PyTorch (a 3x3/2 pool
    # pads an even side asymmetrically, an odd one evenly; the others take Keras' path there;
    # GroupNorm is kernels' autograd function for groups of 2 and of 4 channels alike).
    # Keras' own layers are the reference, forward and backward.
    from vit_keras.resnet import GroupNorm, MaxPool

    x = np.random.default_rng(0).normal(size=(2, *size, channels)).astype("float32")
    pairs = [(GroupNorm(32, epsilon=1e-6, gamma_initializer="random_normal",
                        beta_initializer="random_normal"),
              keras.layers.GroupNormalization(32, epsilon=1e-6)),
             (MaxPool(pool, strides, padding="same"),
              keras.layers.MaxPooling2D(pool, strides, padding="same"))]
    for ours, reference in pairs:
        ours.build(x.shape)
        reference.build(x.shape)
        reference.set_weights(ours.get_weights())
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(x)),
                                   keras.ops.convert_to_numpy(reference(x)), atol=1e-5)
        if keras.backend.backend() == "torch":
            import torch

            grads = []
            for layer in (ours, reference):
                inputs = torch.tensor(x, requires_grad=True)
                (layer(inputs) * torch.linspace(-1, 1, channels)).sum().backward()
                grads.append(inputs.grad.numpy())
            np.testing.assert_allclose(*grads, atol=1e-5)


@pytest.mark.parametrize("channels", [32, 128])  # groups of 1 and of 4 channels
@pytest.mark.parametrize("offset", [0.0, 10.0])  # maps far from zero mean
def test_resnet_group_norm_adds_residual_and_relu_like_keras_layers(channels, offset):
    # ResidualUnit asks its GroupNorm for relu(norm(x) + residual) in one call (on PyTorch
    # kernels' autograd function, whose variance is E[x^2] - E[x]^2). The reference is Keras'
    # GroupNormalization, the sum and ops.relu: values, and on PyTorch the gradients of the
    # maps, the residual, gamma and beta.
    from vit_keras.resnet import GroupNorm

    rng = np.random.default_rng(4)
    x = (rng.normal(size=(3, 6, 5, channels)) + offset).astype("float32")
    residual = rng.normal(size=x.shape).astype("float32")
    ours = GroupNorm(32, epsilon=1e-6, gamma_initializer="random_normal",
                     beta_initializer="random_normal")
    reference = keras.layers.GroupNormalization(32, epsilon=1e-6)
    ours.build(x.shape)
    reference.build(x.shape)
    reference.set_weights(ours.get_weights())

    def keras_layers(maps, shortcut):
        return keras.ops.relu(reference(maps) + shortcut)

    def our_layer(maps, shortcut):  # call takes tensors, as ResidualUnit hands them
        return ours.call(maps, relu=True, residual=shortcut)

    tensors = [keras.ops.convert_to_tensor(a) for a in (x, residual)]
    outputs = [keras.ops.convert_to_numpy(f(*tensors)) for f in (our_layer, keras_layers)]
    np.testing.assert_allclose(*outputs, atol=1e-4)
    assert (outputs[0] == 0).mean() > 0.2  # the ReLU cuts a share of them
    if keras.backend.backend() != "torch":
        return
    import torch

    weight = torch.tensor(rng.normal(size=x.shape).astype("float32"))
    grads = []
    for f, layer in ((our_layer, ours), (keras_layers, reference)):
        maps, shortcut = (torch.tensor(a, requires_grad=True) for a in (x, residual))
        (f(maps, shortcut) * weight).sum().backward()
        grads.append([maps.grad.numpy(), shortcut.grad.numpy(),
                      layer.gamma.value.grad.numpy(), layer.beta.value.grad.numpy()])
        layer.gamma.value.grad = layer.beta.value.grad = None
    for got, want in zip(*grads, strict=True):  # float32 sums over maps of mean 10 lose digits
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("size", [(16, 16), (18, 13)])
@pytest.mark.parametrize("use_bias", [True, False])
def test_patch_embedding_equals_keras_strided_convolution(size, use_bias):
    # PyTorch multiplies the flattened patches by the kernel (kernels.patch_embedding), the
    # others convolve. The reference values are each whole 4x4 patch's sum of pixel times kernel
    # in NumPy (18x13 images leave rows and columns past the last whole patch out); the
    # reference gradients, on PyTorch, those of Keras' "valid" convolution with stride 4.
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, *size, 3)).astype("float32")
    layer = vk.layers.PatchEmbedding(4, 8, use_bias=use_bias)
    layer.build((None, None, None, 3))
    layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.weights])
    kernel = keras.ops.convert_to_numpy(layer.kernel)
    bias = keras.ops.convert_to_numpy(layer.bias) if use_bias else np.zeros(8, "float32")
    grid_h, grid_w = size[0] // 4, size[1] // 4
    patches = x[:, :grid_h * 4, :grid_w * 4].reshape(2, grid_h, 4, grid_w, 4, 3)
    reference = np.einsum("bipjqc,pqcd->bijd", patches, kernel).reshape(2, -1, 8) + bias
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), reference, atol=1e-4)
    if keras.backend.backend() == "torch":
        weights = torch.linspace(-1, 1, 8)
        inputs = torch.tensor(x, requires_grad=True)
        (layer(inputs) * weights).sum().backward()
        got_input, got_kernel = inputs.grad.numpy(), layer.kernel.value.grad.numpy()
        inputs = torch.tensor(x, requires_grad=True)
        kernel_tensor = torch.tensor(kernel, requires_grad=True)
        (ops.conv(inputs, kernel_tensor, strides=4, padding="valid") * weights).sum().backward()
        np.testing.assert_allclose(got_input, inputs.grad.numpy(), atol=1e-4)
        np.testing.assert_allclose(got_kernel, kernel_tensor.grad.numpy(), atol=1e-4)


# bfloat16 keeps 8 significant bits: rounding to nearest moves a value by at most 2**-8 of it.
BFLOAT16_UNIT_ROUNDOFF = 2.0**-8


def to_bfloat16(x):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32: the top 16
    bits of each value after adding half of the dropped bits' range."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded & np.uint32(0xFFFF0000)).view(np.float32)


def bfloat16_roundings_on_deepest_path(config) -> int:
    """The outputs rounded to bfloat16 one after another on the way from a hybrid's pixels to
    its float32 read-out: the root convolution and GroupNorm, each unit's three convolutions
    and GroupNorms, the patch embedding and the position embedding's sum, and per encoder
    block the first LayerNorm, the query, the attention logits, the probabilities, the
    attended values, the output projection, the residual sum, the second LayerNorm, the two
    MLP projections, the GELU and the residual sum."""
    return 2 + 6 * sum(config["resnet_layers"]) + 2 + 12 * config["num_layers"]


def test_hybrid_under_mixed_bfloat16_follows_float32():
    """The patch embedding, StdConv's standardised kernel and the unit's sublayers compute in
    bfloat16 under the mixed policy: the same model's float32 logits are the reference, to
    bfloat16's own error. Each of the L roundings on the deepest path moves a value by at most
    2**-8 of it; independent errors add in quadrature, so each logit stays within
    sqrt(L) 2**-8 of the logits' scale (their root mean square) of float32's, every rounding
    taken at its largest."""
    config = {**TINY, "patch_size": 2, "resnet_layers": (1,), "resnet_width": 32}
    x = images(batch=8)
    full = randomize(vk.vit(config, image_size=32, num_classes=3))
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        half = vk.vit(config, image_size=32, num_classes=3)
    finally:
        keras.config.set_dtype_policy("float32")
    half.set_weights(full.get_weights())
    got = keras.ops.convert_to_numpy(keras.ops.cast(half(x), "float32"))
    want = keras.ops.convert_to_numpy(full(x))
    tolerance = (math.sqrt(bfloat16_roundings_on_deepest_path(config)) * BFLOAT16_UNIT_ROUNDOFF
                 * np.sqrt(np.mean(want**2)))
    assert np.abs(got - want).max() <= tolerance, (np.abs(got - want).max(), tolerance)


@pytest.mark.parametrize("size", [(9, 12), (16, 16)])
@pytest.mark.parametrize("kernel, strides", [(7, 2), (3, 1), (3, 2), (1, 1), (1, 2)])
def test_resnet_convolution_equals_keras_conv_of_standardised_kernel(size, kernel, strides):
    # StdConv takes kernels' direct path on PyTorch (a strided "same" convolution pads an even
    # side asymmetrically). Keras' convolution of the kernel standardised by NumPy (by torch
    # for the gradients) is the reference, forward and backward (to the input and raw kernel).
    from vit_keras.resnet import WEIGHT_STD_EPSILON, StdConv

    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, *size, 8)).astype("float32")
    raw = rng.normal(1.0, 2.0, size=(kernel, kernel, 8, 16)).astype("float32")
    centred = raw - raw.mean(axis=(0, 1, 2))
    standardised = centred / (np.sqrt((centred**2).mean(axis=(0, 1, 2))) + WEIGHT_STD_EPSILON)
    ours = StdConv(16, kernel, strides)
    reference = keras.layers.Conv2D(16, kernel, strides, padding="same", use_bias=False)
    ours.build(x.shape)
    reference.build(x.shape)
    ours.set_weights([raw])
    reference.set_weights([standardised])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(x)),
                               keras.ops.convert_to_numpy(reference(x)), atol=1e-4)
    if keras.backend.backend() == "torch":
        import torch

        inputs = torch.tensor(x, requires_grad=True)
        (ours(inputs) * torch.linspace(-1, 1, 16)).sum().backward()
        got_input, got_kernel = inputs.grad.numpy(), ours.kernel.value.grad.numpy()
        inputs = torch.tensor(x, requires_grad=True)
        kernel_tensor = torch.tensor(raw, requires_grad=True)
        mean = kernel_tensor.mean(dim=(0, 1, 2))
        std = ((kernel_tensor - mean) ** 2).mean(dim=(0, 1, 2)).sqrt()
        outputs = keras.ops.conv(inputs, (kernel_tensor - mean) / (std + WEIGHT_STD_EPSILON),
                                 strides, padding="same")
        (outputs * torch.linspace(-1, 1, 16)).sum().backward()
        np.testing.assert_allclose(got_input, inputs.grad.numpy(), atol=1e-4)
        np.testing.assert_allclose(got_kernel, kernel_tensor.grad.numpy(), atol=1e-4)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "bfloat16"])
@pytest.mark.parametrize("channels", [64, 128])  # a channels-first copy; channels-last maps
def test_resnet_group_norm_under_half_precision_rounds_the_exact_norm_once(policy, channels):
    """GroupNorm computes in float32 under a half-precision policy and rounds its output once:
    every value is within one bfloat16 rounding (2**-8 of it) of the exact norm (NumPy in
    float64) of its bfloat16 inputs and its weights as stored, plus float32's own error. The
    inputs are off-centre, as a convolution's outputs are: there a variance computed in
    bfloat16 (as E[x^2] - E[x]^2) loses several bits."""
    from vit_keras.resnet import GroupNorm

    rng = np.random.default_rng(1)
    x = to_bfloat16(rng.normal(rng.uniform(-4, 4, channels), 1.0, (2, 8, 8, channels)))
    ours = GroupNorm(32, epsilon=1e-6, beta_initializer="random_normal", dtype=policy)
    ours.build(x.shape)
    got = keras.ops.convert_to_numpy(keras.ops.cast(ours(keras.ops.cast(x, "bfloat16")),
                                                    "float32"))
    gamma, beta = (keras.ops.convert_to_numpy(keras.ops.cast(weight.value, "float32"))
                   for weight in (ours.gamma, ours.beta))
    exact = numpy_vit.group_norm(x.astype("float64"), gamma, beta, eps=1e-6)
    assert np.all(got == to_bfloat16(got))  # bfloat16 values
    error = np.abs(got - exact) - BFLOAT16_UNIT_ROUNDOFF * np.abs(exact)
    assert error.max() <= 1e-5, error.max()
