"""vit_keras.kernels: the one switch over the fast paths, the attention routing, and compat's
checks that turn a fast path off when a private name it needs is missing."""

import dataclasses
import os
import warnings

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests.conftest import TINY, randomize
from vit_keras import compat, kernels, training

BACKEND = keras.backend.backend()


@pytest.fixture
def fresh_checks():
    """compat's cached checks run again inside the test and after it."""
    compat.supports.cache_clear()
    yield
    compat.supports.cache_clear()


@pytest.mark.parity
def test_the_switch_is_read_from_the_environment_and_turns_every_fast_path_off():
    """VIT_KERAS_FAST_PATHS=0 (CI runs the parity tests so on PyTorch) turns every fast path
    off and sends the blocks to their Keras calls; unset, PyTorch takes them all, and JAX its
    fused attention (on an accelerator: attention_route)."""
    switched_off = os.environ.get("VIT_KERAS_FAST_PATHS") == "0"
    assert kernels.FAST_PATHS_ON is not switched_off
    block = vk.layers.TransformerBlock(num_heads=4, mlp_dim=64)
    block.build((2, 17, 32))
    on = not switched_off and BACKEND == "torch"  # the direct path pays on PyTorch only
    assert {name: kernels.uses(name) for name in kernels.FAST_PATHS} == {
        name: on for name in ("direct_layers", "torch_attention", "channels_last_convolution",
                              "multi_tensor_clipping", "fused_adam")} | {
        "jax_attention": not switched_off and BACKEND == "jax"}
    assert block.attention.takes_direct_path() is on and block.mlp.takes_direct_path() is on


MODELS = {  # (config, vk.vit options): a plain ViT; a relative-position one (its bias through
    # the attention kernel, and "gap" so that the last block's offsets between patches reach
    # the logits); a hybrid (the channels-last convolution, GroupNorm and pool)
    "plain": (TINY, {}),
    "relative": (TINY, dict(posemb="relative", qkv_bias=False, classifier="gap")),
    "hybrid": ({**TINY, "patch_size": 2, "resnet_layers": (1,), "resnet_width": 32}, {}),
}


def run_both_ways(make, monkeypatch):
    """make() with the fast paths on, then off (the switch as VIT_KERAS_FAST_PATHS=0 sets it)."""
    results = []
    for on in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "FAST_PATHS_ON", on)
            keras.utils.set_random_seed(1)
            results.append(make())
    return results


@pytest.mark.parity
@pytest.mark.skipif(BACKEND != "torch", reason="the fast paths that these models take run on "
                                               "PyTorch only (kernels.FAST_PATHS)")
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_fast_and_general_paths_agree_on_logits_and_a_training_step(kind, monkeypatch):
    """The same model's logits, and its weights after one AdamW step with weight decay and
    global-norm clipping, agree to 1e-5 in float32 with the fast paths on and off."""
    config, options = MODELS[kind]
    images = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    labels = keras.ops.one_hot(np.array([0, 1, 2, 1]), 3)
    recipe = dataclasses.replace(training.RECIPES["pretrain"], warmup_steps=0, clipnorm=0.5)

    trained = []

    def logits_and_training_step():
        model = randomize(vk.vit(config, image_size=32, num_classes=3, **options))
        before = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
        logits = keras.ops.convert_to_numpy(model(images))
        training.compile_model(model, recipe, total_steps=10, jit_compile=False)
        model.train_on_batch(images, labels)
        trained.extend(model.trainable_weights)
        return logits, [keras.ops.convert_to_numpy(w) - start
                        for w, start in zip(model.trainable_weights, before, strict=True)]

    (fast_logits, fast_steps), (logits, steps) = run_both_ways(logits_and_training_step,
                                                               monkeypatch)
    np.testing.assert_allclose(fast_logits, logits, atol=1e-5)
    assert np.abs(logits).max() > 0.1
    for fast, general in zip(fast_steps, steps, strict=True):
        np.testing.assert_allclose(fast, general, atol=1e-5)
    # every weight moved, but the keys' bias: a softmax ignores what it adds to a query's logits
    still = [w.path for w, step in zip(trained[-len(steps):], steps, strict=True)
             if np.abs(step).max() < 1e-4 and not w.path.endswith("key/bias")]
    assert not still, still


# The routing rule, written out case by case: (backend, device, kernel, bias, dropout,
# probabilities, fast paths on) -> kernel.
ROUTES = [
    # the probabilities and attention dropout: only the einsums give them
    *[(backend, device, kernel, bias, True, False, True, "einsum")
      for backend in ("tensorflow", "jax", "torch") for device in ("cpu", "gpu", "tpu")
      for kernel in ("auto", "fused") for bias in (False, True)],
    *[(backend, "gpu", "auto", False, False, True, True, "einsum")
      for backend in ("tensorflow", "jax", "torch")],
    # "einsum" asked for
    *[(backend, "tpu", "einsum", False, False, False, True, "einsum")
      for backend in ("tensorflow", "jax", "torch")],
    # "auto": PyTorch's own kernel, but not with a bias on an accelerator
    ("torch", "cpu", "auto", False, False, False, True, "torch"),
    ("torch", "cpu", "auto", True, False, False, True, "torch"),
    ("torch", "gpu", "auto", False, False, False, True, "torch"),
    ("torch", "gpu", "auto", True, False, False, True, "einsum"),
    ("torch", "cpu", "auto", False, False, False, False, "einsum"),
    # "auto" on JAX: Keras' fused kernel on an accelerator without a bias
    ("jax", "cpu", "auto", False, False, False, True, "einsum"),
    ("jax", "gpu", "auto", False, False, False, True, "keras"),
    ("jax", "tpu", "auto", False, False, False, True, "keras"),
    ("jax", "tpu", "auto", True, False, False, True, "einsum"),
    ("jax", "gpu", "auto", True, False, False, True, "einsum"),
    ("jax", "gpu", "auto", False, False, False, False, "einsum"),
    # TensorFlow: the einsums under "auto"
    ("tensorflow", "cpu", "auto", False, False, False, True, "einsum"),
    ("tensorflow", "gpu", "auto", True, False, False, True, "einsum"),
    # "fused" asked for: the backend's kernel, PyTorch's called directly where the fast
    # paths are on
    ("torch", "gpu", "fused", True, False, False, True, "torch"),
    ("torch", "cpu", "fused", False, False, False, False, "keras"),
    ("jax", "cpu", "fused", True, False, False, True, "keras"),
    ("jax", "gpu", "fused", False, False, False, True, "keras"),
    ("tensorflow", "gpu", "fused", True, False, False, True, "keras"),
]


def test_attention_route_follows_the_rule_case_by_case():
    wrong = [(*case, kernels.attention_route(*case[:-1])) for case in ROUTES
             if kernels.attention_route(*case[:-1]) != case[-1]]
    assert not wrong, wrong


@pytest.mark.parametrize("device, fused", [("gpu", "cuDNN"), ("tpu", "Splash")])
def test_fused_attention_with_a_bias_on_a_jax_accelerator_is_refused(device, fused):
    with pytest.raises(ValueError, match=(
            rf"attention_kernel='fused' with a logit bias \(relative position embeddings\) "
            rf"on JAX on a {device}: .*{fused}.*expected attention_kernel 'auto' or 'einsum'")):
        kernels.attention_route("jax", device, "fused", bias=True)


@pytest.mark.parametrize("device", ["cpu", "gpu", "tpu"])
def test_a_relative_bias_reaches_only_a_kernel_that_adds_it(device, monkeypatch):
    """On this backend, with the tensors' device faked: a relative model's attention under
    "auto" goes where attention_route sends it and equals the einsums; a fused kernel that is
    not the route raises if called."""
    block = vk.layers.TransformerBlock(num_heads=4, mlp_dim=64, position_bias="relative",
                                       num_patches=16, num_prefix_tokens=1)
    block.build((2, 17, 32))
    for variable in block.trainable_variables:  # the offset table too, which starts at zero
        variable.assign(np.random.default_rng(0).normal(0, 0.2, variable.shape))
    tokens = np.random.default_rng(1).normal(size=(2, 17, 32)).astype("float32")
    expected = keras.ops.convert_to_numpy(block(tokens, return_attention_scores=True)[0])
    # the rule for a bias under "auto": PyTorch's own kernel on its CPU (fast paths on), the
    # einsums everywhere else
    on_torch_cpu = BACKEND == "torch" and device == "cpu" and kernels.FAST_PATHS_ON
    route = "torch" if on_torch_cpu else "einsum"
    called = []

    def forbidden(name, kernel):
        def call(*args, **kwargs):
            called.append(name)
            if name != route:
                raise AssertionError(f"{name} attention called on the {route} route")
            return kernel(*args, **kwargs)
        return call

    monkeypatch.setattr(kernels, "device_kind", lambda tensor: device)
    monkeypatch.setattr(kernels, "torch_attention",
                        forbidden("torch", kernels.torch_attention))
    monkeypatch.setattr(kernels.ops, "dot_product_attention",
                        forbidden("keras", keras.ops.dot_product_attention))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(block(tokens)), expected, atol=2e-5)
    assert called == ([] if route == "einsum" else [route])


def test_device_kind_of_this_backends_tensors_is_cpu():
    assert kernels.device_kind(keras.ops.ones((2,))) == "cpu"


def drop(monkeypatch, owner, name):
    """Fakes a Keras or PyTorch release without `name`: removed from the module, or from
    every class in owner's hierarchy that defines it."""
    holders = [cls for cls in getattr(owner, "__mro__", ()) if name in vars(cls)] or [owner]
    for holder in holders:
        monkeypatch.delattr(holder, name)


@pytest.mark.skipif(BACKEND != "torch", reason="the fused update is PyTorch's")
@pytest.mark.parametrize("name, path", [("_fused_adam_", "fused_adam"),
                                        ("_foreach_norm", "multi_tensor_clipping")])
def test_a_missing_torch_name_turns_its_fast_path_off_with_one_warning(
        name, path, monkeypatch, fresh_checks):
    import torch

    drop(monkeypatch, torch, name)
    with pytest.warns(RuntimeWarning, match=rf"torch\.{name}.* missing or changed in torch .* "
                                            r"\(checked with 2\.14\.1\)"):
        assert not kernels.uses(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not kernels.uses(path)  # warned once
    # the optimizer trains on Keras' path: the names are not called
    model = vk.vit(TINY, image_size=32, num_classes=3)
    recipe = dataclasses.replace(training.RECIPES["pretrain"], warmup_steps=0, clipnorm=0.5)
    training.compile_model(model, recipe, total_steps=10, jit_compile=False)
    before = keras.ops.convert_to_numpy(model.trainable_weights[0])
    model.train_on_batch(np.zeros((2, 32, 32, 3), "float32"), keras.ops.one_hot([0, 1], 3))
    assert np.abs(keras.ops.convert_to_numpy(model.trainable_weights[0]) - before).max() > 0


def test_a_missing_keras_hook_refuses_layerwise_rates_by_name(monkeypatch, fresh_checks):
    """Layer-wise rates override Keras' update steps; where Keras renamed one, the overrides
    would go uncalled and every layer train at one rate, so the optimizer refuses."""
    drop(monkeypatch, keras.optimizers.AdamW, "_backend_update_step")
    with pytest.warns(RuntimeWarning), pytest.raises(
            RuntimeError, match=r"layer-wise learning rates needs .*"
                                r"Optimizer\._backend_update_step.* missing or changed in keras"):
        training.LayerwiseAdamW(rate_multipliers={})


def test_checks_pass_on_the_tested_versions(fresh_checks):
    """Every check this backend runs passes with the pinned Keras and PyTorch."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_at_import()
        for name, feature in compat.FEATURES.items():
            if feature.backend in (None, BACKEND):
                assert compat.supports(name), name
