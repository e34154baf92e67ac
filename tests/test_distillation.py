"""Training with a teacher (vit_keras.distillation, training.compile_distiller, the apps'
--teacher flags): DeiT's objectives against NumPy written from the paper, one step's
gradients by hand, the teacher's view of the student's inputs, and the student alone
afterwards."""

import dataclasses
import json

import keras
import numpy as np
import pytest

import vit_keras as vk
from apps import train as train_app
from apps.common import run
from tests.conftest import TINY, backend_independent, images, randomize
from tests.conftest import TINY_FLAGS as TINY_VIT_FLAGS
from tests.test_training import FASHION_MNIST, TINY_FLAGS
from vit_keras import configs, distillation, training

CLASSES = 5
TAU, LAMBDA, SMOOTHING = 2.0, 0.3, 0.1


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def cross_entropy(labels, logits):
    return -(labels * log_softmax(logits)).sum(-1).mean()


def deit_objective(kind, labels, z_cls, z_dist, z_teacher):
    """DeiT's Eq. 2 and 3 (Touvron et al. 2021), labels already smoothed."""
    if kind == "hard":
        teacher_labels = np.eye(CLASSES)[z_teacher.argmax(-1)]
        return 0.5 * cross_entropy(labels, z_cls) + 0.5 * cross_entropy(teacher_labels, z_dist)
    p_teacher = np.exp(log_softmax(z_teacher / TAU))
    kl = (p_teacher * (np.log(p_teacher) - log_softmax(z_dist / TAU))).sum(-1).mean()
    return (1 - LAMBDA) * cross_entropy(labels, z_cls) + LAMBDA * TAU**2 * kl


def mixed_labels(batch, seed=0):
    """One-hot labels mixed pairwise, as Mixup and CutMix leave them."""
    rng = np.random.default_rng(seed)
    one_hot = np.eye(CLASSES, dtype="float32")[rng.integers(0, CLASSES, batch)]
    share = rng.uniform(0.5, 1.0, (batch, 1)).astype("float32")
    return share * one_hot + (1 - share) * one_hot[::-1]


def smoothed(labels):
    return labels * (1 - SMOOTHING) + SMOOTHING / CLASSES


def models(token, teacher_size=32, teacher_convention=None):
    student = randomize(vk.vit(TINY, image_size=32, num_classes=CLASSES, distilled=token),
                        seed=1)
    teacher = randomize(vk.vit(TINY, image_size=teacher_size, num_classes=CLASSES,
                               input_convention=teacher_convention), seed=2, scale=0.5)
    return student, teacher


def head_logits(student, x):
    """(class head's, distillation head's) logits, read from the heads' own layers."""
    names = [configs.HEAD, configs.HEAD_DIST if distillation.has_distillation_token(student)
             else configs.HEAD]
    outputs = keras.Model(student.input, [student.get_layer(n).output for n in names])(x)
    return [keras.ops.convert_to_numpy(o).astype("float64") for o in outputs]


def numpy(tensor):
    return keras.ops.convert_to_numpy(tensor).astype("float64")


@pytest.mark.parametrize("token", [False, True], ids=["one_head", "distillation_token"])
@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_the_distillers_loss_is_deits_objective(kind, token):
    student, teacher = models(token)
    x, labels = images(6), mixed_labels(6)
    distiller = distillation.distiller(student, teacher, kind, temperature=TAU, weight=LAMBDA)
    distiller.compile(optimizer="sgd", loss=distillation.ClassHeadLoss(SMOOTHING))
    loss = distiller.compute_loss(x=x, y=labels, y_pred=distiller(x))
    z_cls, z_dist = head_logits(student, x)
    expected = deit_objective(kind, smoothed(labels), z_cls, z_dist, numpy(teacher(x)))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    if token:  # the two terms fall on different heads: swapped, the loss differs
        swapped = deit_objective(kind, smoothed(labels), z_dist, z_cls, numpy(teacher(x)))
        assert abs(swapped - expected) > 1e-3


@pytest.mark.parametrize("accumulation", [None, 2])
@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_one_step_moves_each_head_by_its_own_terms_gradient(kind, accumulation):
    """SGD at rate 1: each head's kernel moves by pooled token^T dL/dlogits, computed by
    hand from the logits: label term on the class head, teacher term on head_dist."""
    student, teacher = models(token=True)
    x, labels = images(6), mixed_labels(6)
    recipe = training.Recipe("sgd", 1.0, "linear", 0, momentum=0.0, clipnorm=None,
                             label_smoothing=SMOOTHING, distillation=kind,
                             distillation_token=True, distillation_temperature=TAU,
                             distillation_weight=LAMBDA,
                             gradient_accumulation_steps=accumulation)
    distiller = training.compile_distiller(student, recipe, total_steps=10**9, teacher=teacher)
    pooled = keras.Model(student.input, [student.get_layer(name).output
                                          for name in ("pool_cls", configs.POOL_DIST)])(x)
    f_cls, f_dist = (numpy(p) for p in pooled)
    z_cls, z_dist = head_logits(student, x)
    z_teacher = numpy(teacher(x))
    batch, label_weight = len(x), 0.5 if kind == "hard" else 1 - LAMBDA
    d_cls = label_weight * (np.exp(log_softmax(z_cls)) - smoothed(labels)) / batch
    if kind == "hard":
        d_dist = 0.5 * (np.exp(log_softmax(z_dist)) - np.eye(CLASSES)[z_teacher.argmax(-1)])
    else:
        d_dist = LAMBDA * TAU * (np.exp(log_softmax(z_dist / TAU))
                                 - np.exp(log_softmax(z_teacher / TAU)))
    d_dist /= batch
    heads = {name: student.get_layer(name).kernel for name in (configs.HEAD, configs.HEAD_DIST)}
    before = {name: numpy(kernel) for name, kernel in heads.items()}
    teacher_before = [numpy(w) for w in teacher.weights]
    for _ in range((accumulation or 1) - 1):  # accumulating: no update yet
        distiller.train_on_batch(x, labels)
        for name, kernel in heads.items():
            np.testing.assert_array_equal(numpy(kernel), before[name])
    distiller.train_on_batch(x, labels)
    np.testing.assert_allclose(numpy(heads[configs.HEAD]), before[configs.HEAD] - f_cls.T @ d_cls,
                               atol=2e-5)
    np.testing.assert_allclose(numpy(heads[configs.HEAD_DIST]),
                               before[configs.HEAD_DIST] - f_dist.T @ d_dist, atol=2e-5)
    for weight, old in zip(teacher.weights, teacher_before, strict=True):  # frozen
        np.testing.assert_array_equal(numpy(weight), old)


@pytest.mark.parametrize("token", [False, True], ids=["one_head", "distillation_token"])
def test_the_teacher_sees_the_students_batch_in_its_own_convention_and_size(token):
    student, teacher = models(token, teacher_size=16, teacher_convention="deit_in1k")
    x = images(3)
    pixels = (numpy(x) + 1.0) / 2.0  # the student's [-1, 1] on the [0, 1] scale
    imagenet = (pixels - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    resized = keras.ops.image.resize(imagenet.astype("float32"), (16, 16),
                                     interpolation="bilinear")
    expected = numpy(teacher(resized))
    seen = numpy(distillation.teacher_view(teacher, student)(x))
    np.testing.assert_allclose(seen, np.stack([expected] * 2, 1) if token else expected,
                               atol=1e-5)


def batches(count, batch=4):
    """A generator of `count` fixed training batches."""
    x, labels = images(batch), mixed_labels(batch)
    for _ in range(count):
        yield x, labels


class Interruption(keras.callbacks.Callback):
    """Stops a run as a kill would, when the epoch `at` begins (the previous one backed up)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError("interrupted")


@pytest.mark.parametrize("token", [False, True], ids=["one_head", "distillation_token"])
def test_the_run_saves_the_student_alone_which_answers_with_its_heads_mean(tmp_path, token):
    student, teacher = models(token)
    recipe = training.Recipe("adamw", 1e-3, "cosine", 0, distillation="hard",
                             distillation_token=token)
    training.train(student, recipe, batches(4), epochs=2, steps_per_epoch=2, run_dir=tmp_path,
                   teacher=teacher, keep_checkpoints=2, verbose=0)
    x = images(3)
    z_cls, z_dist = head_logits(student, x)
    for path in (tmp_path / "last.keras", tmp_path / "checkpoints" / "epoch-002.keras"):
        saved = vk.load_model(path, compile=False)
        assert [layer.name for layer in saved.layers] == [layer.name for layer in student.layers]
        np.testing.assert_allclose(numpy(saved(x)), (z_cls + z_dist) / 2, atol=1e-5)
    assert "Distiller" not in (tmp_path / "last.keras").read_bytes().decode("latin-1")


def test_an_interrupted_distillation_resumes_from_its_last_epoch(tmp_path, monkeypatch):
    recipe = training.Recipe("adamw", 1e-2, "cosine", 0, distillation="soft",
                             distillation_token=True)
    callbacks = training.callbacks

    def run(run_dir, steps, interrupt_at=None):
        student, teacher = models(token=True)  # as a new process: fresh weights
        monkeypatch.setattr(training, "callbacks", lambda *args, **kwargs: [
            *callbacks(*args, **kwargs), Interruption(interrupt_at)])
        history = training.train(student, recipe, batches(steps), epochs=3, steps_per_epoch=1,
                                 run_dir=run_dir, teacher=teacher, verbose=0)
        return student, history

    with pytest.raises(RuntimeError, match="interrupted"):
        run(tmp_path / "resumed", 3, interrupt_at=2)
    resumed, history = run(tmp_path / "resumed", 1)  # only the third epoch is left
    whole, _ = run(tmp_path / "whole", 3)
    assert sorted(history) == [0, 1, 2]
    assert all({"student_loss", "distillation_loss", "accuracy"} <= set(logs)
               for logs in history.values())
    for weight, expected in zip(resumed.weights, whole.weights, strict=True):
        np.testing.assert_allclose(numpy(weight), numpy(expected), atol=1e-6)


def test_mixed_precision_trains_a_two_head_student(tmp_path):
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        student, teacher = models(token=True)
        recipe = training.Recipe("adamw", 1e-3, "cosine", 0, distillation="hard",
                                 distillation_token=True)
        history = training.train(student, recipe, batches(2), epochs=1, steps_per_epoch=2,
                                 run_dir=tmp_path, teacher=teacher, verbose=0)
    finally:
        keras.config.set_dtype_policy(policy)
    assert np.isfinite([history[0]["student_loss"], history[0]["distillation_loss"]]).all()


def test_a_teacher_the_student_cannot_learn_from_is_refused():
    student = vk.vit(TINY, image_size=32, num_classes=CLASSES)
    other = vk.vit(TINY, image_size=32, num_classes=CLASSES + 1)
    with pytest.raises(ValueError, match="the teacher answers 6 classes and the student 5: "
                                         "expected the same classes"):
        distillation.distiller(student, other, "hard")
    with pytest.raises(ValueError, match=r"distillation 'medium': expected one of hard, soft"):
        distillation.distiller(student, student, "medium")
    with pytest.raises(ValueError, match=r"distillation weight 1.5: expected a number in"):
        distillation.distiller(student, student, "soft", weight=1.5)
    with pytest.raises(ValueError, match="distillation temperature 0: expected a positive"):
        distillation.TeacherLoss("soft", temperature=0)
    token = training.Recipe("sgd", 0.1, "linear", 0, distillation="hard",
                            distillation_token=True)
    with pytest.raises(ValueError, match="the model 'vit_d32_l2_p8' has no distillation token: "
                                         r"expected vk.vit\(..., distilled=True\)"):
        training.compile_distiller(student, token, 10, teacher=other)
    with pytest.raises(ValueError, match="distillation 'hard' needs a teacher"):
        training.compile_distiller(student, dataclasses.replace(token, distillation_token=False),
                                   10)
    with pytest.raises(ValueError, match="distillation_token=True needs a distillation"):
        training.Recipe("sgd", 0.1, "linear", 0, distillation_token=True)
    with pytest.raises(ValueError, match=r"distillation_weight 1.5: expected a number in "
                                         r"\[0, 1\] \(soft distillation's lambda\)"):
        training.Recipe("sgd", 0.1, "linear", 0, distillation="soft", distillation_weight=1.5)
    with pytest.raises(ValueError, match="distillation_temperature 0: expected a positive"):
        training.Recipe("sgd", 0.1, "linear", 0, distillation="soft",
                        distillation_temperature=0)
    with pytest.raises(ValueError, match="teacher 't.keras' needs a distillation"):
        training.Recipe("sgd", 0.1, "linear", 0, teacher="t.keras")
    plain = training.Recipe("sgd", 0.1, "linear", 0)
    with pytest.raises(ValueError, match="a teacher needs a recipe with distillation"):
        training.train(student, plain, None, epochs=1, steps_per_epoch=1, run_dir="unused",
                       teacher=other)


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
@backend_independent
def test_train_teaches_a_student_with_a_distillation_token_from_a_run(tmp_path):
    common = ["--limit", "256", "--eval-limit", "128", "--epochs", "1", *TINY_FLAGS]
    teacher = train_app.main([*common, "--run-dir", str(tmp_path / "teacher")])
    result = train_app.main([*common, "--run-dir", str(tmp_path / "student"),
                             "--teacher", teacher["model"], "--distillation", "hard",
                             "--distillation-token", "--classifier", "token"])
    history = json.loads((tmp_path / "student" / "history.json").read_text())
    assert {"student_loss", "distillation_loss"} <= set(history["0"])
    student = vk.load_model(result["model"], compile=False)
    assert distillation.has_distillation_token(student)
    arguments = json.loads((tmp_path / "student" / "arguments.json").read_text())
    assert arguments["distillation"] == "hard" and arguments["distillation_token"]
    assert 0.0 <= result["test_accuracy"] <= 1.0


@backend_independent
@pytest.mark.parametrize("flags, message", [
    (["--teacher", "{teacher}"], "--teacher needs --distillation hard or soft"),
    (["--distillation", "soft"], "--distillation soft needs --teacher TEACHER.keras"),
    (["--distillation", "hard", "--teacher", "{missing}"],
     "--teacher '{missing}': expected a .keras file, found none"),
    (["--distillation", "hard", "--teacher", "{teacher}", "--distillation-token"],
     "--distillation-token needs --classifier token (the distillation token sits beside the "
     "class token), got --classifier gap"),
])
def test_bad_teacher_flags_are_refused_in_one_line(tmp_path, flags, message, capsys):
    teacher, missing = tmp_path / "teacher.keras", tmp_path / "none.keras"
    teacher.write_bytes(b"")
    names = dict(teacher=teacher, missing=missing)
    argv = [*(flag.format(**names) for flag in flags), "--run-dir", str(tmp_path / "run"),
            "--limit", "128"]
    with pytest.raises(SystemExit) as exit:
        run(train_app.main, argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {message.format(**names)}" in err
    assert not (tmp_path / "run").exists()


@backend_independent
def test_finetune_teaches_from_a_teacher_of_another_size_and_refuses_a_token_it_cannot_load(
        tmp_path):
    from apps import finetune
    from tests import official_layout
    from tests.test_apps import write_images

    params = official_layout.random_checkpoint(np.random.default_rng(5), grid=(4, 4), classes=9)
    np.savez(tmp_path / "pretrained.npz", **params)
    write_images(tmp_path / "images", 8, 48, seed=6)
    vk.vit(TINY, image_size=32, num_classes=2).save(tmp_path / "teacher.keras")
    argv = [str(tmp_path / "pretrained.npz"), *TINY_VIT_FLAGS, "--classifier", "token", "--posemb",
            "learned", "--image-size", "48", "--folder", str(tmp_path / "images"), "--epochs",
            "1", "--batch-size", "4", "--teacher", str(tmp_path / "teacher.keras"),
            "--distillation", "soft"]
    with pytest.warns(UserWarning, match="zero-initialised"):
        result = finetune.main([*argv, "--run-dir", str(tmp_path / "run")])
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert result["epochs"] == 1 and "distillation_loss" in history["0"]
    with pytest.raises(ValueError, match="the model has DeiT's distillation token "
                                         r"\('dist_token/tokens'\), the checkpoint has not"):
        finetune.main([*argv, "--distillation-token", "--run-dir", str(tmp_path / "token")])


@backend_independent
def test_finetune_refuses_convnet_in_one_line(tmp_path, capsys):
    from apps import finetune

    with pytest.raises(SystemExit) as exit:
        run(finetune.main, ["weights.npz", "--convnet", "--run-dir", str(tmp_path / "run")])
    assert exit.value.code == 2
    assert capsys.readouterr().err.startswith(
        "error: --convnet trains a ResNet from scratch (vit-keras train --convnet); vit-keras "
        "finetune starts from a ViT checkpoint")
    assert "--convnet" not in finetune.build_parser().format_help()
