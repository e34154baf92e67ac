"""Training recipes as data, and the pieces model.fit needs for them: schedules, optimizers
with weight decay on kernels only, callbacks that let an interrupted run resume."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import time

import keras
from keras import ops

from vit_keras import distribute


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything about how a ViT is trained that is not the model's shape or the data."""

    optimizer: str  # "adamw" | "sgd"
    learning_rate: float
    schedule: str  # "linear" | "cosine" (after linear warmup)
    warmup_steps: int | float  # steps, or a fraction of all steps when < 1
    weight_decay: float = 0.0  # kernels only; Keras multiplies it by the learning rate
    beta_2: float = 0.999
    momentum: float = 0.9
    clipnorm: float | None = 1.0  # global norm
    label_smoothing: float = 0.0
    dropout_rate: float = 0.0
    stochastic_depth_rate: float = 0.0
    patch_drop_rate: float = 0.0  # vk.vit's: patch tokens each training image leaves out
    randaugment: tuple[int, float] | None = None  # (num_ops, magnitude 0..1)
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    ema_momentum: float | None = None  # Polyak averaging of the weights
    gradient_accumulation_steps: int | None = None
    crop: str = "inception"
    flip: bool = True
    source: str = ""


RECIPES: dict[str, Recipe] = {
    # Paper, pre-training on ImageNet-21k: Adam, linear warmup and decay.
    "pretrain": Recipe("adamw", 1e-3, "linear", 10_000, weight_decay=0.03, dropout_rate=0.1,
                       source="Dosovitskiy et al. 2021, Sec. 4.1 and Table 3"),
    # Paper, fine-tuning: SGD momentum 0.9, warmup 500 then cosine, no weight decay.
    "finetune": Recipe("sgd", 0.01, "cosine", 500, source="Dosovitskiy et al. 2021, Table 4"),
    # DeiT-style training from scratch on small data.
    "scratch": Recipe("adamw", 5e-4, "cosine", 0.05, weight_decay=0.05, label_smoothing=0.1,
                      stochastic_depth_rate=0.1, randaugment=(2, 0.5), mixup_alpha=0.8,
                      cutmix_alpha=1.0, source="Touvron et al. 2021 (DeiT)"),
    # Paper, masked patch prediction (Appendix B.1.2): Adam at 2e-4, 10k warmup steps,
    # cosine decay; no augmentation named.
    "mpp": Recipe("adamw", 2e-4, "cosine", 10_000, crop="none", flip=False,
                  source="Dosovitskiy et al. 2021, Appendix B.1.2"),
    # The main job: a small ViT on 28x28 Fashion-MNIST, tuned for 2 CPU cores.
    "fashion_mnist": Recipe("adamw", 3e-3, "cosine", 0.05, weight_decay=0.05,
                            crop="none", flip=True, patch_drop_rate=0.5,
                            source="this repository (README, main job)"),
}


def with_options(recipe: Recipe, options: list[str]) -> Recipe:
    """The recipe with "field=value" changes (value a Python literal, else a string), as the
    apps' --recipe-option gives them."""
    fields = {field.name for field in dataclasses.fields(Recipe)}
    changes = {}
    for option in options:
        name, equals, text = option.partition("=")
        if not equals or name not in fields:
            raise ValueError(f"recipe option {option!r}: expected FIELD=VALUE with FIELD one "
                             f"of {', '.join(sorted(fields))}")
        try:
            changes[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            changes[name] = text
    return dataclasses.replace(recipe, **changes)


def pipeline_options(recipe: Recipe) -> dict:
    """The recipe's augmentation as keyword arguments of vit_keras.data.make_pipeline:
    crop, flip, RandAugment (on uint8-range values), Mixup and CutMix."""
    augment = ()
    if recipe.randaugment:
        num_ops, magnitude = recipe.randaugment
        augment = (keras.layers.RandAugment(value_range=(0, 255), num_ops=num_ops,
                                            factor=magnitude),)
    return dict(crop=recipe.crop, flip=recipe.flip, augment=augment,
                mixup_alpha=recipe.mixup_alpha, cutmix_alpha=recipe.cutmix_alpha)


@keras.saving.register_keras_serializable(package="vit_keras")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to peak over warmup_steps, then linear or cosine decay to end."""

    def __init__(self, peak: float, total_steps: int, warmup_steps: int = 0,
                 decay: str = "cosine", end: float = 0.0):
        if decay not in ("linear", "cosine"):
            raise ValueError(f"unknown decay {decay!r}: expected 'linear' or 'cosine'")
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(f"warmup_steps {warmup_steps} must be in [0, total_steps "
                             f"{total_steps})")
        self.peak, self.total_steps, self.warmup_steps = peak, total_steps, warmup_steps
        self.decay, self.end = decay, end

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = self.peak * step / max(self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / (self.total_steps - self.warmup_steps),
                            0.0, 1.0)
        if self.decay == "linear":
            shape = 1.0 - progress
        else:
            shape = 0.5 * (1.0 + ops.cos(math.pi * progress))
        decayed = self.end + (self.peak - self.end) * shape
        return ops.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps,
                "warmup_steps": self.warmup_steps, "decay": self.decay, "end": self.end}


def warmup_steps(recipe: Recipe, total_steps: int) -> int:
    steps = recipe.warmup_steps
    steps = int(steps * total_steps) if steps < 1 else int(steps)
    return min(steps, total_steps - 1)


def make_optimizer(recipe: Recipe, model: keras.Model, total_steps: int,
                   learning_rate: float | None = None) -> keras.optimizers.Optimizer:
    """The recipe's optimizer; weight decay applies to kernels only (not biases, norms,
    class token or position embeddings), as big_vision does."""
    schedule = WarmupSchedule(learning_rate or recipe.learning_rate, total_steps,
                              warmup_steps(recipe, total_steps), recipe.schedule)
    common = dict(learning_rate=schedule, global_clipnorm=recipe.clipnorm,
                  use_ema=recipe.ema_momentum is not None,
                  ema_momentum=recipe.ema_momentum or 0.99,
                  gradient_accumulation_steps=recipe.gradient_accumulation_steps)
    if recipe.optimizer == "adamw":
        optimizer = keras.optimizers.AdamW(weight_decay=recipe.weight_decay, beta_1=0.9,
                                           beta_2=recipe.beta_2, **common)
        optimizer.exclude_from_weight_decay(var_list=no_decay_variables(model))
        return optimizer
    if recipe.optimizer == "sgd":
        return keras.optimizers.SGD(momentum=recipe.momentum, **common)
    raise ValueError(f"unknown optimizer {recipe.optimizer!r}: expected 'adamw' or 'sgd'")


def no_decay_variables(model: keras.Model) -> list:
    return [v for v in model.trainable_variables if not v.name.endswith("kernel")]


def compile_model(model: keras.Model, recipe: Recipe, total_steps: int,
                  learning_rate: float | None = None, jit_compile: bool | str = "auto",
                  steps_per_execution: int = 1) -> keras.Model:
    """model.compile for the recipe: its optimizer and schedule, cross-entropy on one-hot
    labels (what make_pipeline emits) with its label smoothing, top-1 and top-5 accuracy.
    jit_compile is model.compile's, Keras' "auto" unless the caller chooses."""
    model.compile(
        optimizer=make_optimizer(recipe, model, total_steps, learning_rate),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True,
                                                  label_smoothing=recipe.label_smoothing),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy"),
                 # k can be at most the class count (PyTorch's topk refuses more)
                 keras.metrics.TopKCategoricalAccuracy(k=min(5, model.outputs[0].shape[-1]),
                                                       name="top5")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


class HistoryFile(keras.callbacks.Callback):
    """The epoch logs as JSON (and CSV beside it), keyed by epoch and rewritten atomically
    after each one, so a run resumed by BackupAndRestore ends with one complete history (no
    gaps, no repeats). Each epoch also records its wall-clock epoch_seconds (training and any
    evaluation), measured here rather than read off a progress bar. Place it before
    BackupAndRestore in the callback list."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.epoch_started = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_started = time.perf_counter()

    def read(self) -> dict[int, dict]:
        if not os.path.exists(self.path):
            return {}
        with open(self.path) as file:
            return {int(k): v for k, v in json.load(file).items()}

    def on_epoch_end(self, epoch, logs=None):
        history = self.read()
        history[epoch] = {k: float(v) for k, v in (logs or {}).items()}
        if self.epoch_started is not None:
            history[epoch]["epoch_seconds"] = round(time.perf_counter() - self.epoch_started, 2)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as file:
            json.dump({str(k): history[k] for k in sorted(history)}, file, indent=1)
        os.replace(tmp, self.path)
        columns = sorted({k for logs in history.values() for k in logs})
        rows = [",".join(["epoch", *columns])]
        rows += [",".join([str(e), *(repr(history[e].get(c, "")) for c in columns)])
                 for e in sorted(history)]
        with open(tmp, "w") as file:
            file.write("\n".join(rows) + "\n")
        os.replace(tmp, os.path.splitext(self.path)[0] + ".csv")


def callbacks(run_dir: str, tensorboard: bool = True) -> list[keras.callbacks.Callback]:
    """Checkpoint, resume, logs and NaN guard for a run kept in run_dir."""
    os.makedirs(run_dir, exist_ok=True)
    found = [
        keras.callbacks.TerminateOnNaN(),
        HistoryFile(os.path.join(run_dir, "history.json")),
        # double_checkpoint: a kill during the weights write leaves the previous backup to
        # resume from (seen here: SIGKILL mid-save left an unreadable .h5).
        keras.callbacks.BackupAndRestore(os.path.join(run_dir, "backup"),
                                         double_checkpoint=True),
        keras.callbacks.ModelCheckpoint(os.path.join(run_dir, "last.keras")),
    ]
    if tensorboard:
        found.append(keras.callbacks.TensorBoard(os.path.join(run_dir, "logs")))
    return found


def train(model: keras.Model, recipe: Recipe, train_data, *, epochs: int, steps_per_epoch: int,
          run_dir: str, validation_data=None, validation_freq: int = 1,
          learning_rate: float | None = None,
          distribution=None, jit_compile: bool | str = "auto", steps_per_execution: int = 1,
          verbose="auto", compile=compile_model) -> dict[int, dict]:
    """model.fit with the recipe's optimizer and the resumable callbacks; returns the
    complete per-epoch history (including epochs run before an interruption).
    distribution: a vit_keras.distribute.Distribution whose scope the model was built in.
    compile: compile_model's signature; another objective's (vit_keras.masked) for models
    that are not classifiers."""
    distribution = distribution or distribute.choose("none")
    with distribution.scope():
        compile(model, recipe, epochs * steps_per_epoch, learning_rate,
                jit_compile=jit_compile, steps_per_execution=steps_per_execution)
    distribute.prepare_model(model, distribution)
    run_callbacks = callbacks(run_dir)
    model.fit(train_data, epochs=epochs, steps_per_epoch=steps_per_epoch, shuffle=False,
              validation_data=validation_data, validation_freq=validation_freq,
              callbacks=run_callbacks, verbose=verbose)
    return next(c for c in run_callbacks if isinstance(c, HistoryFile)).read()
