import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests.conftest import TINY, backend_independent, images, randomize
from vit_keras import compat, data, kernels, training

ROOT = Path(__file__).parents[1]
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_schedule_equals_its_formula(decay):
    schedule = training.WarmupSchedule(peak=1e-3, total_steps=110, warmup_steps=10, decay=decay)
    shape = {"cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)), "linear": lambda p: 1 - p}
    for step, expected in [(0, 0.0), (5, 5e-4), (10, 1e-3), (35, 1e-3 * shape[decay](0.25)),
                           (60, 1e-3 * shape[decay](0.5)), (110, 0.0), (200, 0.0)]:
        np.testing.assert_allclose(float(schedule(step)), expected, atol=1e-9, err_msg=step)
    restored = training.WarmupSchedule.from_config(schedule.get_config())
    for step in (0, 5, 35, 60, 110):  # warmup and decay alike, as a loaded model resumes
        assert float(restored(step)) == float(schedule(step)), step


def test_weight_decay_touches_kernels_only():
    model = vk.vit(TINY, image_size=32, num_classes=3, representation_size=8)
    recipe = training.Recipe("adamw", 0.1, "linear", 0, weight_decay=0.5)
    optimizer = training.make_optimizer(recipe, model, total_steps=10**9)
    before = {v.path: keras.ops.convert_to_numpy(v).copy() for v in model.trainable_variables}
    for variable in model.trainable_variables:  # nothing is zero, so decay would show
        variable.assign(np.ones(variable.shape, "float32"))
    zero_grads = [keras.ops.zeros(v.shape) for v in model.trainable_variables]
    optimizer.apply(zero_grads, model.trainable_variables)  # Adam step of 0: only decay acts
    changed = {v.path for v in model.trainable_variables
               if not np.allclose(keras.ops.convert_to_numpy(v), 1.0)}
    kernels = {p for p in before if p.endswith("kernel")}
    assert changed == kernels
    assert any("cls" in p for p in before) and any("pos_embedding" in p for p in before)


@pytest.mark.parity
@pytest.mark.parametrize("global_norm", [0.5, 10.0])
def test_gradients_clipped_to_the_recipes_global_norm(global_norm, monkeypatch):
    # PyTorch clips with torch's multi-tensor ops (kernels.clip_by_global_norm_fused), the
    # others with Keras'; either way a plain SGD step of rate 1 moves each variable by its
    # gradient times min(1, clipnorm / the norm of all gradients together), computed here.
    # The limit is read at each step: changed after the optimizer was made, the new one holds.
    model = vk.vit(TINY, image_size=32, num_classes=3)
    recipe = training.Recipe("sgd", 1.0, "linear", 0, momentum=0.0, clipnorm=1.0)
    optimizer = training.make_optimizer(recipe, model, total_steps=10**9)
    clipped_by_torch = []
    foreach_norm = compat.foreach_norm
    monkeypatch.setattr(compat, "foreach_norm", lambda tensors: (
        clipped_by_torch.append(1), foreach_norm(tensors))[1])
    optimizer.global_clipnorm = 2.0
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
    norm = math.sqrt(sum(float((g.astype("float64") ** 2).sum()) for g in grads))
    grads = [g * (global_norm / norm) for g in grads]
    before = [keras.ops.convert_to_numpy(v).copy() for v in variables]
    optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    scale = min(1.0, 2.0 / global_norm)
    assert len(clipped_by_torch) == kernels.uses("multi_tensor_clipping")
    for variable, start, grad in zip(variables, before, grads, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), start - scale * grad,
                                   atol=1e-6, err_msg=variable.path)


def adamw_reference(start, grads_per_step, rates, decayed, weight_decay, epsilon):
    """Keras' AdamW (beta_1 0.9, beta_2 0.999) in NumPy float64: decoupled decay of the
    decayed variables by the step's rate, then Adam with the bias corrections in the rate and
    epsilon added to sqrt(v)."""
    values = [v.astype("float64") for v in start]
    m = [np.zeros_like(v) for v in values]
    s = [np.zeros_like(v) for v in values]
    for t, (grads, rate) in enumerate(zip(grads_per_step, rates, strict=True), start=1):
        alpha = rate * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        for i, grad in enumerate(grads):
            if decayed[i]:
                values[i] *= 1 - weight_decay * rate
            m[i] = 0.9 * m[i] + 0.1 * grad
            s[i] = 0.999 * s[i] + 0.001 * grad.astype("float64") ** 2
            values[i] -= alpha * m[i] / (np.sqrt(s[i]) + epsilon)
    return values


@pytest.mark.parity
def test_adamw_steps_equal_keras_formula(monkeypatch):
    # PyTorch updates with torch's fused Adam kernel (kernels.adam_update_fused), which adds
    # epsilon elsewhere in the formula; the others with Keras' update. A large epsilon and
    # gradients near it make its place show; the schedule's rate changes at every step.
    model = vk.vit(TINY, image_size=32, num_classes=3)
    recipe = training.Recipe("adamw", 1e-2, "linear", 0, weight_decay=0.3, clipnorm=None)
    optimizer = training.make_optimizer(recipe, model, total_steps=4)
    fused_calls = []
    fused_adam = compat.fused_adam_
    monkeypatch.setattr(compat, "fused_adam_", lambda *args, **kwargs: (
        fused_calls.append(1), fused_adam(*args, **kwargs)))
    optimizer.epsilon = 1e-3  # read at each step
    variables = model.trainable_variables
    start = [keras.ops.convert_to_numpy(v).copy() for v in variables]
    rng = np.random.default_rng(0)
    steps = [[rng.normal(scale=1e-3, size=v.shape).astype("float32") for v in variables]
             for _ in range(3)]
    rates = [1e-2 * (1 - step / 4) for step in range(3)]  # the schedule's, step by step
    for grads in steps:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    assert len(fused_calls) == 3 * kernels.uses("fused_adam")
    decayed = [v.path.endswith("kernel") for v in variables]
    expected = adamw_reference(start, steps, rates, decayed, 0.3, 1e-3)
    for variable, want in zip(variables, expected, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), want, rtol=1e-5,
                                   atol=1e-7, err_msg=variable.path)


def test_amsgrad_keeps_keras_update():
    # the fused kernel is not handed amsgrad's running maximum: Keras' own update runs. After
    # a small second gradient v falls a tenth below its maximum (beta_2 0.9): amsgrad matters.
    results = {}
    for fused, amsgrad in [(True, True), (False, True), (False, False)]:
        variable = keras.Variable(np.ones((3, 4), "float32"))
        optimizer = keras.optimizers.Adam(learning_rate=0.1, beta_2=0.9, amsgrad=amsgrad)
        if fused:
            kernels.adam_update_fused(optimizer)
        for scale in (1.0, 0.01):
            optimizer.apply([keras.ops.full((3, 4), scale)], [variable])
        results[fused, amsgrad] = keras.ops.convert_to_numpy(variable)
    np.testing.assert_allclose(results[True, True], results[False, True], rtol=1e-6)
    assert not np.allclose(results[False, True], results[False, False], rtol=1e-4)


@pytest.mark.parametrize("case", ["transposed variable", "float64 gradient"])
def test_fused_adam_leaves_what_it_cannot_take_to_keras(case):
    # the fused kernel pairs elements in memory order and wants one dtype: a variable laid
    # out transposed (a NumPy view) or a gradient of another dtype takes Keras' update
    start = (np.arange(12, dtype="float32").reshape(4, 3) / 12).T  # a transposed view
    if case == "float64 gradient":
        start = np.ascontiguousarray(start)
    dtype = "float64" if case == "float64 gradient" else "float32"
    grad = np.linspace(-1, 1, 12).reshape(3, 4)
    results = []
    for fused in (True, False):
        variable = keras.Variable(start)
        optimizer = keras.optimizers.Adam(learning_rate=0.1)
        if fused:
            kernels.adam_update_fused(optimizer)
        for _ in range(2):
            optimizer.apply([keras.ops.convert_to_tensor(grad, dtype)], [variable])
        results.append(keras.ops.convert_to_numpy(variable))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
    assert not np.allclose(results[0], start)


def compile_case():
    """The main job's kinds of layers (a ResNet stem, sincos2d, global average pooling) in a
    tiny hybrid, a batch, and the recipe's AdamW and clipping."""
    config = vk.ViTConfig(32, 1, 4, 64, 2, resnet_layers=(1,), resnet_width=32)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    y = np.eye(3)[rng.integers(0, 3, 4)].astype("float32")
    recipe = training.Recipe("adamw", 1e-2, "cosine", 0, weight_decay=0.1, clipnorm=0.5)

    def model():
        return vk.vit(config, image_size=32, num_classes=3, classifier="gap", posemb="sincos2d")

    return model, x, y, recipe


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile: torch backend")
def test_torch_compile_traces_the_hybrids_forward_as_one_graph():
    # jit_compile=True on PyTorch is torch.compile: no NumPy conversion (the sincos2d table)
    # or other untraceable call breaks the forward into frames.
    import torch

    model, x, _, _ = compile_case()
    explained = torch._dynamo.explain(model())(torch.as_tensor(x), training=True)
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile: torch backend")
def test_torch_compiled_steps_train_the_hybrid_like_eager(monkeypatch):
    # Two compiled steps on the CPU leave the weights eager steps leave (the fused Adam update
    # cannot be traced: Keras' runs there). AOT autograd (functionalization included) without
    # inductor's C++ build.
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    model, x, y, recipe = compile_case()
    start = randomize(model(), seed=3).get_weights()
    compile_with, compiled_frames = torch.compile, CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(torch, "compile", lambda fn: compile_with(fn, backend=compiled_frames))
    results = []
    for jit_compile in (True, False):
        trained = model()
        trained.set_weights(start)
        training.compile_model(trained, recipe, total_steps=10, jit_compile=jit_compile)
        # As after any step: the optimizer built and every weight's gradient present, so that
        # torch.compile traces Keras' train step once (its zero_grad branches on the gradients)
        trained.optimizer.build(trained.trainable_variables)
        for variable in trained.trainable_variables:
            variable.value.grad = torch.zeros_like(variable.value)
        for _ in range(2):
            trained.train_on_batch(torch.as_tensor(x), torch.as_tensor(y))
        results.append(trained.get_weights())
        assert compiled_frames.frame_count > 0  # the first run's steps were compiled
    for compiled, eager in zip(*results, strict=True):
        np.testing.assert_allclose(compiled, eager, atol=1e-5)
    assert sum(not np.allclose(w, b) for w, b in zip(results[1], start, strict=True)) > 10


def test_gradient_accumulation_equals_one_big_batch():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    y = np.eye(3)[rng.integers(0, 3, 8)].astype("float32")
    results = []
    for accumulate, batch in [(2, 4), (None, 8)]:
        keras.utils.set_random_seed(0)
        model = vk.vit(TINY, image_size=32, num_classes=3)
        start = [np.full(w.shape, 0.05, "float32") + 0.01 * np.arange(w.size).reshape(w.shape)
                 % 0.1 for w in model.get_weights()]
        model.set_weights(start)
        recipe = training.Recipe("sgd", 0.5, "linear", 0, momentum=0.0, clipnorm=None,
                                 gradient_accumulation_steps=accumulate)
        training.compile_model(model, recipe, total_steps=10**9)
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        results.append(model.get_weights())
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)
    # the step moved the weights (else both runs would agree trivially)
    moved = [not np.allclose(after, before)
             for after, before in zip(results[0], start, strict=True)]
    assert sum(moved) > len(moved) / 2, moved


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_xla_trains_like_jit_compile_false(policy):
    """XLA on TensorFlow and JAX (on PyTorch Keras' default, eager, as no XLA is there)
    against jit_compile=False: same
    loss, same weights after two AdamW steps with dropout off. In bfloat16 the losses agree
    to its rounding; the weights are not compared there, since Adam's first step moves each
    one by about the learning rate in its gradient's direction, which bfloat16's rounding
    flips for gradients near zero."""
    keras.config.set_dtype_policy(policy)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    y = np.eye(3)[rng.integers(0, 3, 4)].astype("float32")
    recipe = training.Recipe("adamw", 1e-2, "linear", 0, weight_decay=0.1)
    start = randomize(vk.vit(TINY, image_size=32, num_classes=3), seed=3).get_weights()
    losses, weights = [], []
    # TensorFlow and JAX: XLA against eager. PyTorch: "auto" is eager there (True would be
    # torch.compile), so this compares Keras' default with jit_compile=False, two eager paths.
    xla = "auto" if keras.backend.backend() == "torch" else True
    for jit_compile in (xla, False):
        model = vk.vit(TINY, image_size=32, num_classes=3)
        model.set_weights(start)
        training.compile_model(model, recipe, total_steps=10**9, jit_compile=jit_compile)
        losses.append([model.train_on_batch(x, y)[0] for _ in range(2)])
        weights.append(model.get_weights())
    assert not np.allclose(weights[0][0], start[0])
    if policy == "mixed_bfloat16":
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-3)
        return
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    for fast, reference in zip(*weights, strict=True):
        np.testing.assert_allclose(fast, reference, atol=1e-5)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_compile_keeps_keras_jit_default_unless_asked(policy):
    """The library's compile leaves jit_compile to Keras ("auto", whatever the host), and
    passes an explicit choice through; the model trains either way."""
    recipe = training.Recipe("adamw", 1e-3, "cosine", 0)
    keras.config.set_dtype_policy(policy)  # the conftest fixture sets float32 back
    ours = training.compile_model(vk.vit(TINY, image_size=32, num_classes=3), recipe, 10)
    keras_auto = vk.vit(TINY, image_size=32, num_classes=3)
    keras_auto.compile(jit_compile="auto")
    assert ours.jit_compile is keras_auto.jit_compile
    ours.train_on_batch(images(batch=2), np.eye(3, dtype="float32")[[0, 1]])
    if keras.backend.backend() != "torch":  # True would mean torch.compile there
        chosen = training.compile_model(vk.vit(TINY, image_size=32, num_classes=3), recipe,
                                        10, jit_compile=True)
        assert chosen.jit_compile is True


@backend_independent
def test_no_library_module_reads_the_host():
    """No default may depend on the CPU model or its flags: nothing in the package reads
    them."""
    package = Path(vk.__file__).parent
    for path in package.rglob("*.py"):
        text = path.read_text()
        for word in ("cpuinfo", "avx", "cpu_count", "platform.processor"):
            assert word not in text, (path, word)


@backend_independent
def test_pipeline_options_carry_the_recipe_augmentation():
    options = training.pipeline_options(training.RECIPES["scratch"])
    assert options["crop"] == "inception" and options["flip"]
    assert [type(layer).__name__ for layer in options["augment"]] == ["RandAugment"]
    assert options["augment"][0].num_ops == 2
    assert (options["mixup_alpha"], options["cutmix_alpha"]) == (0.8, 1.0)
    assert training.pipeline_options(training.RECIPES["finetune"])["augment"] == ()


@backend_independent
def test_history_file_keeps_one_row_per_epoch(tmp_path):
    history = training.HistoryFile(str(tmp_path / "history.json"))
    for epoch, loss in [(0, 2.0), (1, 1.5), (1, 1.4), (2, 1.0)]:  # epoch 1 ran twice
        history.on_epoch_end(epoch, {"loss": loss})
    assert history.read() == {0: {"loss": 2.0}, 1: {"loss": 1.4}, 2: {"loss": 1.0}}
    csv = (tmp_path / "history.csv").read_text().splitlines()
    assert csv == ["epoch,loss", "0,2.0", "1,1.4", "2,1.0"]


def test_recipe_fields_reach_the_optimizer():
    model = vk.vit(TINY, image_size=32, num_classes=3)
    recipe = training.Recipe("sgd", 0.01, "cosine", 0.1, ema_momentum=0.999, clipnorm=1.0)
    optimizer = training.make_optimizer(recipe, model, total_steps=100)
    assert optimizer.use_ema and optimizer.ema_momentum == 0.999
    assert optimizer.global_clipnorm == 1.0
    assert optimizer._learning_rate.warmup_steps == 10
    adam = training.make_optimizer(training.Recipe("adamw", 0.01, "cosine", 0, beta_2=0.99,
                                                   weight_decay=0.05), model, total_steps=100)
    assert adam.beta_2 == 0.99 and adam.weight_decay == 0.05
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        training.make_optimizer(training.Recipe("lamb", 0.1, "cosine", 0), model, 10)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])  # float16: loss scaling
def test_saved_compile_state_loads_on_tensorflow(tmp_path, policy):
    """A model trained on any backend names its optimizer by its public Keras class in the
    .keras file, so load_model with its compile state works in a TensorFlow process (the
    PyTorch backend's own class made that process import torch after TensorFlow and crash)."""
    keras.config.set_dtype_policy(policy)
    model = training.compile_model(vk.vit(TINY, image_size=32, num_classes=3),
                                   training.RECIPES["fashion_mnist"], total_steps=10)
    model.train_on_batch(images(4), np.eye(3, dtype="float32")[[0, 1, 2, 0]])
    path = tmp_path / "model.keras"
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        saved = json.loads(archive.read("config.json"))["compile_config"]["optimizer"]
    assert (saved["module"], saved["class_name"]) == ("keras.optimizers", "AdamW")
    if keras.backend.backend() != "torch":
        return  # the file came from the backend it would load on
    load = (f"import keras, vit_keras; m = keras.saving.load_model(r'{path}'); "
            "print(type(m.optimizer).__name__, "
            "m.optimizer.get_config()['learning_rate']['config']['peak'])")
    loaded = subprocess.run([sys.executable, "-c", load], cwd=ROOT, capture_output=True,
                            text=True, timeout=120,
                            env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split()[-2:] == ["AdamW", "0.003"]


def saved_jit_compile(path):
    """The jit_compile a .keras file's compile config records, read from its config.json."""
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("config.json"))["compile_config"]["jit_compile"]


def keras_auto_jit_compile() -> bool:
    """What a fresh model.compile(jit_compile="auto") resolves to on this backend."""
    model = vk.vit(TINY, image_size=32, num_classes=3)
    model.compile(jit_compile="auto")
    return model.jit_compile


@pytest.mark.parametrize("jit_compile", [True, False])
def test_saved_keras_files_record_jit_compile_auto_whatever_the_run_compiled_with(
        tmp_path, jit_compile):
    """Keras records the jit_compile a compile resolved; the library's compile and its .keras
    writer record "auto", so the file compiles as the loading backend chooses, while the
    model itself still runs as it was compiled."""
    ours = training.compile_model(vk.vit(TINY, image_size=32, num_classes=3),
                                  training.RECIPES["fashion_mnist"], total_steps=10,
                                  jit_compile=jit_compile)
    assert ours.jit_compile is jit_compile
    ours.save(tmp_path / "compiled.keras")  # as ModelCheckpoint and the apps save
    users = vk.vit(TINY, image_size=32, num_classes=3)
    users.compile(optimizer="adamw", loss="mse", jit_compile=jit_compile)
    vk.save_weights(users, tmp_path / "users.keras")
    assert users.jit_compile is jit_compile
    for name in ("compiled.keras", "users.keras"):
        assert saved_jit_compile(tmp_path / name) == "auto", name


@pytest.mark.parametrize("jit_compile", [True, False])
def test_a_file_recording_a_resolved_jit_compile_loads_compiled_as_auto(tmp_path, jit_compile):
    """A file written before (plain Keras, which records True or False) loads through
    vk.load_model with its optimizer state and jit_compile as a fresh "auto" compile
    resolves it on this backend (True on PyTorch would torch.compile the first predict)."""
    model = vk.vit(TINY, image_size=32, num_classes=3)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="mse", jit_compile=jit_compile)
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(7)
    model.save(tmp_path / "old.keras")
    assert saved_jit_compile(tmp_path / "old.keras") is jit_compile  # as older files record
    loaded = vk.load_model(tmp_path / "old.keras")
    assert loaded.compiled and int(loaded.optimizer.iterations) == 7
    assert loaded.jit_compile is keras_auto_jit_compile()
    loaded.save(tmp_path / "again.keras")
    assert saved_jit_compile(tmp_path / "again.keras") == "auto"
    np.testing.assert_allclose(loaded.predict(images(), verbose=0),
                               keras.ops.convert_to_numpy(model(images())), atol=1e-5)


@backend_independent
def test_committed_keras_files_record_no_resolved_jit_compile():
    """The models committed under docs/ and notes/ (the docs load them with their compile
    state) record jit_compile "auto", not the True or False their runs resolved."""
    found = sorted({*ROOT.glob("docs/**/*.keras"), *ROOT.glob("notes/**/*.keras")})
    assert found, "no committed .keras files found under docs/ or notes/"
    recorded = {str(path.relative_to(ROOT)): saved_jit_compile(path) for path in found}
    assert recorded == dict.fromkeys(recorded, "auto")


TINY_FLAGS = ["--hidden-size", "32", "--num-layers", "1", "--num-heads", "2", "--mlp-dim", "32",
              "--patch-size", "7", "--resnet-layers", "none", "--image-size", "28",
              "--batch-size", "64"]


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
def test_killed_run_resumes_with_complete_history(tmp_path, capsys):
    from apps import train

    run_dir = tmp_path / "run"
    flags = ["--limit", "1024", "--eval-limit", "256", "--epochs", "5", "--run-dir",
             str(run_dir), *TINY_FLAGS]
    first = subprocess.Popen([sys.executable, "-m", "apps.train", *flags], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    history = run_dir / "history.json"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and first.poll() is None:
            if history.exists() and len(json.loads(history.read_text())) >= 2:
                break
            time.sleep(0.2)
        assert first.poll() is None, "the first run ended before it could be interrupted"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    done_before = len(json.loads(history.read_text()))
    assert 2 <= done_before < 5
    capsys.readouterr()
    # the same command again, here: a process of its own is only needed for the one killed
    train.main(flags)
    epochs = json.loads(history.read_text())
    assert sorted(int(e) for e in epochs) == [0, 1, 2, 3, 4]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["epochs"] == 5
    # the second run did only the epochs that were missing
    assert capsys.readouterr().out.count("Epoch ") <= 5 - done_before + 1


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
def test_end_to_end_on_real_fashion_mnist(tmp_path):
    from apps import train

    result = train.main(["--limit", "8192", "--eval-limit", "2000", "--epochs", "3",
                         "--run-dir", str(tmp_path), *TINY_FLAGS])
    assert result["test_accuracy"] > 0.5  # chance is 0.1
    history = json.loads((tmp_path / "history.json").read_text())
    assert len(history) == 3 and not any("val_accuracy" in e for e in history.values())
    loaded = keras.saving.load_model(result["model"], safe_mode=True)
    assert loaded.output.shape[-1] == 10
    assert (tmp_path / "labels.txt").read_text().splitlines()[0] == "T-shirt/top"
    assert keras.ops.convert_to_numpy(loaded(images(1, 28, 28))).shape == (1, 10)


@backend_independent
def test_recipe_options_change_one_field_and_unknown_ones_are_refused():
    recipe = training.with_options(training.RECIPES["fashion_mnist"],
                                   ["label_smoothing=0.1", "flip=False", "crop=pad2",
                                    "randaugment=(2, 0.5)"])
    assert (recipe.label_smoothing, recipe.flip, recipe.crop, recipe.randaugment) == (
        0.1, False, "pad2", (2, 0.5))
    assert recipe.learning_rate == training.RECIPES["fashion_mnist"].learning_rate
    with pytest.raises(ValueError, match=r"recipe option 'smoothing=0.1': expected FIELD=VALUE "
                                         "with FIELD one of"):
        training.with_options(recipe, ["smoothing=0.1"])


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
def test_seed_makes_a_run_repeatable(tmp_path):
    from apps import train

    def first_loss(seed, name):
        # without flips: tf.data's parallel map draws them in no fixed order
        flags = ["--limit", "128", "--epochs", "1", "--eval-limit", "64", "--seed", str(seed),
                 "--recipe-option", "flip=False", "--run-dir", str(tmp_path / name),
                 *TINY_FLAGS]
        train.main(flags)
        return json.loads((tmp_path / name / "history.json").read_text())["0"]["loss"]

    seed_3 = first_loss(3, "a")
    assert first_loss(3, "b") == seed_3
    assert first_loss(4, "c") != seed_3


@backend_independent
@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
def test_the_main_job_evaluates_at_the_end_unless_eval_every_asks_for_more(tmp_path):
    from apps import train

    def evaluated_epochs(*flags):
        run_dir = tmp_path / str(len(list(tmp_path.iterdir())))
        result = train.main(["--limit", "128", "--epochs", "2", "--eval-limit", "64",
                             "--run-dir", str(run_dir), *TINY_FLAGS, *flags])
        history = json.loads((run_dir / "history.json").read_text())
        evaluated = [epoch for epoch, metrics in sorted(history.items())
                     if "val_accuracy" in metrics]
        if evaluated:  # the final evaluation, always: of the last epoch's model, on those images
            assert result["test_accuracy_single_view"] == pytest.approx(
                history["1"]["val_accuracy"], abs=5e-5)
        else:
            assert "test_accuracy" in result
        return evaluated

    assert evaluated_epochs() == []
    assert evaluated_epochs("--eval-every", "1") == ["0", "1"]
    assert evaluated_epochs("--eval-every", "2") == ["1"]


@backend_independent
@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
def test_a_kept_log_gets_a_summary_line_per_epoch_not_the_progress_bar(tmp_path, capsys):
    """Output that is not a terminal (a file, a pipe, pytest's capture) is kept: Keras' bar
    rewrites its line with carriage returns and backspaces at every step, which fill a log."""
    from apps import train

    train.main(["--limit", "256", "--epochs", "2",
                "--run-dir", str(tmp_path), *TINY_FLAGS])
    printed = capsys.readouterr().out
    assert "\r" not in printed and "\b" not in printed
    epoch_lines = [line for line in printed.splitlines() if line.startswith("4/4 - ")]
    assert len(epoch_lines) == 2 and all("loss: " in line for line in epoch_lines), printed


@backend_independent
def test_paper_recipes_hold_the_papers_values():
    """Sec. 4.1, Table 3 (ImageNet-21k pre-training of B and L) and Table 4 (fine-tuning), as
    vit-facts.md section 5 lists them, in the recipes and in the optimizers they build."""
    pretrain, finetune = training.RECIPES["pretrain"], training.RECIPES["finetune"]
    assert (pretrain.optimizer, pretrain.learning_rate, pretrain.schedule, pretrain.warmup_steps,
            pretrain.weight_decay, pretrain.dropout_rate, pretrain.clipnorm) == (
        "adamw", 1e-3, "linear", 10_000, 0.03, 0.1, 1.0)
    assert (finetune.optimizer, finetune.momentum, finetune.schedule, finetune.warmup_steps,
            finetune.weight_decay, finetune.clipnorm) == ("sgd", 0.9, "cosine", 500, 0.0, 1.0)
    assert 0.003 <= finetune.learning_rate <= 0.06  # the paper's ImageNet sweep
    model = vk.vit(TINY, image_size=32, num_classes=3)
    adam = training.make_optimizer(pretrain, model, total_steps=100_000)
    assert (adam.beta_1, adam.beta_2, adam.global_clipnorm) == (0.9, 0.999, 1.0)
    schedule = adam._learning_rate
    assert (schedule.warmup_steps, schedule.decay) == (10_000, "linear")
    sgd = training.make_optimizer(finetune, model, total_steps=20_000)
    assert (type(sgd).__name__, sgd.momentum, sgd.global_clipnorm) == ("SGD", 0.9, 1.0)
    assert float(sgd._learning_rate(500)) == pytest.approx(finetune.learning_rate)


def test_final_patch_drop_rate_trains_the_last_epochs_on_every_patch(tmp_path):
    """At a learning rate too small to move the weights, an epoch's training loss equals the
    inference loss on the same images exactly when the training step keeps every patch: so
    the first epoch (rate 0.5) differs from it and the last (final rate 0) matches it, on a
    training step traced anew for the new token count."""
    rng = np.random.default_rng(0)
    pixels, labels = rng.integers(0, 256, (16, 16, 16, 3), dtype=np.uint8), np.arange(16) % 4
    model = randomize(vk.vit(TINY | dict(patch_size=4), image_size=16, num_classes=4,
                             classifier="gap", posemb="sincos2d", patch_drop_rate=0.5))
    recipe = dataclasses.replace(training.RECIPES["fashion_mnist"], flip=False, weight_decay=0.0,
                                 warmup_steps=0, final_patch_drop_rate=0.0,
                                 final_patch_drop_epochs=1)
    batches = data.make_pipeline(data.from_arrays(pixels, labels), image_size=16,
                                 num_classes=4, batch_size=8, training=True, crop="none",
                                 flip=False, seed=0)
    history = training.train(model, recipe, batches.repeat(), epochs=2, steps_per_epoch=2,
                             run_dir=str(tmp_path), learning_rate=1e-12, verbose=0)
    inference = model.evaluate(batches, verbose=0, return_dict=True)["loss"]
    assert model.get_layer("patch_dropout").rate == 0.0
    assert abs(history[0]["loss"] - inference) > 1e-3, (history[0]["loss"], inference)
    np.testing.assert_allclose(history[1]["loss"], inference, rtol=1e-5)


def test_final_patch_drop_rate_needs_patch_dropout_and_enough_epochs(tmp_path):
    recipe = dataclasses.replace(training.RECIPES["fashion_mnist"], final_patch_drop_rate=0.0,
                                 final_patch_drop_epochs=3)
    plain = vk.vit(TINY, image_size=16, num_classes=4)
    with pytest.raises(ValueError, match="needs a model built with patch dropout.*"
                                         "has no layer 'patch_dropout'"):
        training.patch_drop_callbacks(recipe, plain, epochs=5)
    dropping = vk.vit(TINY, image_size=16, num_classes=4, patch_drop_rate=0.5)
    with pytest.raises(ValueError, match=r"final_patch_drop_epochs 3: expected 1 to the run's "
                                         r"2 epochs"):
        training.patch_drop_callbacks(recipe, dropping, epochs=2)
