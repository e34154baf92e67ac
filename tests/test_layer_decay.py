"""Fine-tuning's learning rates by layer (vit_keras.training.layer_rates, LayerwiseAdamW,
LayerwiseSGD: checked by the updates the optimizer applies) and a run's kept epoch
checkpoints (--keep-checkpoints)."""

import dataclasses
import os

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests.conftest import TINY, TINY_FLAGS, backend_independent, randomize
from vit_keras import compat, kernels, training

DECAY, HEAD = 0.5, 10.0
LEARNING_RATE = 1e-2


def tiny_model(num_classes=3):
    return randomize(vk.vit(TINY, image_size=16, num_classes=num_classes), seed=1)


def expected_rate(path: str) -> float:
    """MAE's layer ids (util/lr_decay.py) for TINY's 2 blocks: embeddings layer 0, block i
    layer i + 1, the rest layer 3; rate DECAY^(3 - layer), the head's times HEAD."""
    layer = path.split("/")[0]
    if layer in ("embedding", "cls", "Transformer_posembed_input"):
        return DECAY ** 3
    if layer.startswith("Transformer_encoderblock_"):
        return DECAY ** (2 - int(layer.rsplit("_", 1)[1]))
    return HEAD if layer == "head" else 1.0


def recipe(optimizer: str, **changes) -> training.Recipe:
    return dataclasses.replace(training.RECIPES["finetune"], optimizer=optimizer,
                               learning_rate=LEARNING_RATE, warmup_steps=0, clipnorm=None,
                               layer_decay=DECAY, head_lr_multiplier=HEAD, **changes)


def values(variables) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v).copy() for v in variables]


def test_layer_rates_follow_mae_layer_ids():
    model = tiny_model()
    rates = training.layer_rates(model, DECAY, HEAD)
    assert rates["embedding/kernel"] == rates["cls/cls"] == 0.125
    assert rates["Transformer_posembed_input/pos_embedding"] == 0.125
    assert rates["Transformer_encoderblock_0/MlpBlock_3/Dense_0/kernel"] == 0.25
    assert rates["Transformer_encoderblock_1/LayerNorm_0/gamma"] == 0.5
    assert "Transformer_encoder_norm/gamma" not in rates  # the full rate
    assert rates["head/kernel"] == rates["head/bias"] == 10.0
    assert {v.path: rates.get(v.path, 1.0) for v in model.trainable_variables} == {
        v.path: expected_rate(v.path) for v in model.trainable_variables}
    assert training.layer_rates(model) == {}


@pytest.mark.parity
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_first_step_scales_each_variables_rate_and_weight_decay(optimizer):
    """One update with known gradients against the optimizers' equations at each variable's
    rate: SGD's first step is -rate * g (the momentum buffer starts at 0); AdamW's is
    -rate * g / (|g| + eps / sqrt(1 - beta_2)), after decoupled weight decay of the kernels
    by rate * weight_decay (scaled like the rate, as timm's parameter groups do)."""
    model = tiny_model()
    weight_decay = 0.1 if optimizer == "adamw" else 0.0
    optimizer = training.make_optimizer(recipe(optimizer, weight_decay=weight_decay), model,
                                        total_steps=100)
    rng = np.random.default_rng(2)
    grads = [rng.normal(0, 1, v.shape).astype("float32") for v in model.trainable_variables]
    before = values(model.trainable_variables)
    optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], model.trainable_variables)
    for variable, v0, g, v1 in zip(model.trainable_variables, before, grads,
                                   values(model.trainable_variables), strict=True):
        rate = LEARNING_RATE * expected_rate(variable.path)
        if weight_decay:
            decayed = v0 * (1 - rate * weight_decay) if variable.path.endswith("kernel") else v0
            expected = decayed - rate * g / (np.abs(g) + 1e-7 / np.sqrt(1 - 0.999))
        else:
            expected = v0 - rate * g
        np.testing.assert_allclose(v1 - v0, expected - v0, rtol=1e-4, atol=1e-8,
                                   err_msg=variable.path)  # float32 steps


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's fused Adam kernel")
def test_layerwise_adamw_takes_the_fused_update_once_per_rate_group(monkeypatch):
    """On PyTorch each group of variables that share a rate is one call of torch's fused Adam
    kernel (kernels.adam_update_fused), as Keras' own AdamW's variables are; with the fast
    paths off, none."""
    calls = []
    fused = compat.fused_adam_
    monkeypatch.setattr(compat, "fused_adam_", lambda *args, **kwargs: (
        calls.append(len(args[0])), fused(*args, **kwargs)))
    for on in (True, False):
        monkeypatch.setattr(kernels, "FAST_PATHS_ON", on)
        calls.clear()
        model = tiny_model()
        optimizer = training.make_optimizer(recipe("adamw"), model, total_steps=100)
        assert isinstance(optimizer, training.LayerwiseAdamW)
        optimizer.apply([keras.ops.ones(v.shape) for v in model.trainable_variables],
                        model.trainable_variables)
        groups = {}
        for variable in model.trainable_variables:
            groups[expected_rate(variable.path)] = groups.get(
                expected_rate(variable.path), 0) + 1
        assert sorted(calls) == (sorted(groups.values()) if on else [])


def test_fit_with_gradient_accumulation_applies_the_rates_and_they_survive_saving(tmp_path):
    """Through model.fit (JAX's stateless update, TensorFlow's compiled step): with 2 steps
    accumulated the first fit step changes nothing, the second is Adam's first update, whose
    largest change in each variable is its rate times |g| / (|g| + eps'): at most the rate,
    and close to it (the multipliers differ by 2x and more)."""
    model = tiny_model()
    training.compile_model(model, recipe("adamw", gradient_accumulation_steps=2),
                           total_steps=10**6, jit_compile=False)
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    y = np.eye(3, dtype="float32")[[0, 1, 2, 0]]
    before = values(model.trainable_variables)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    for v0, v1 in zip(before, values(model.trainable_variables), strict=True):
        np.testing.assert_array_equal(v0, v1)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    for variable, v0, v1 in zip(model.trainable_variables, before,
                                values(model.trainable_variables), strict=True):
        if variable.path.endswith("key/bias"):
            continue  # no gradient: the softmax over keys ignores a shift of every logit
        largest = np.abs(v1 - v0).max() / LEARNING_RATE
        assert 0.9 < largest / expected_rate(variable.path) < 1.001, variable.path
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    assert type(loaded.optimizer) is training.LayerwiseAdamW
    assert loaded.optimizer.rate_multipliers == training.layer_rates(model, DECAY, HEAD)
    for saved, restored in zip(model.optimizer.variables, loaded.optimizer.variables,
                                   strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(saved),
                                      keras.ops.convert_to_numpy(restored))


@pytest.mark.parametrize("option, message", [
    ("layer_decay=0", "layer_decay 0: expected a number in (0, 1]"),
    ("layer_decay=1.5", "layer_decay 1.5: expected a number in (0, 1]"),
    ("layer_decay=high", "layer_decay 'high': expected a number in (0, 1]"),
    ("head_lr_multiplier=-1", "head_lr_multiplier -1: expected a positive number"),
])
def test_bad_rates_are_refused_in_one_line(option, message):
    with pytest.raises(ValueError) as raised:
        training.with_options(training.RECIPES["finetune"], [option])
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_rates_need_the_layers_they_scale():
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="layer_decay needs a model whose encoder blocks are "
                                         "layers named Transformer_encoderblock_0"):
        training.layer_rates(plain, 0.75)
    features = vk.vit(TINY, image_size=16, include_top=False)
    with pytest.raises(ValueError, match="head_lr_multiplier needs a model with a layer named "
                                         "'head'"):
        training.layer_rates(features, None, 10.0)


@backend_independent
def test_finetune_flags_set_the_rates_and_a_run_keeps_its_last_checkpoints(tmp_path, capsys):
    from apps import finetune
    from apps.common import run
    from tests.test_apps import write_images

    model = tiny_model(num_classes=2)
    model.save(tmp_path / "pretrained.keras")
    write_images(tmp_path / "images", 4, 16, seed=4)
    run_dir = tmp_path / "run"
    shape = TINY_FLAGS
    argv = [str(tmp_path / "pretrained.keras"), *shape, "--image-size", "16", "--classifier",
            "token", "--posemb", "learned", "--folder", str(tmp_path / "images"),
            "--epochs", "3", "--batch-size", "4", "--jit-compile", "false",
            "--keep-checkpoints", "2", "--layer-decay", str(DECAY),
            "--head-lr-multiplier", str(HEAD), "--run-dir", str(run_dir)]
    finetune.main(argv)
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["epoch-002.keras", "epoch-003.keras"]
    assert not (run_dir / "backup").exists()  # the resume state, removed once the run ends
    newest = keras.saving.load_model(run_dir / "checkpoints" / "epoch-003.keras")
    final = keras.saving.load_model(run_dir / "model.keras")
    for kept, last in zip(values(newest.weights), values(final.weights), strict=True):
        np.testing.assert_array_equal(kept, last)
    assert type(newest.optimizer) is training.LayerwiseSGD
    assert newest.optimizer.rate_multipliers == training.layer_rates(final, DECAY, HEAD)

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        run(finetune.main, [*argv[:-6], "--layer-decay", "2", "--run-dir",
                            str(tmp_path / "refused")])
    assert exited.value.code == 2
    assert capsys.readouterr().err == ("error: layer_decay 2.0: expected a number in (0, 1] "
                                       "(1 or None: no decay)\n")
