"""Training recipes as data, and the pieces model.fit needs for them: schedules, optimizers
with weight decay on kernels only and per-layer learning rates for fine-tuning, callbacks that
let an interrupted run resume."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import re
import time

import keras
from keras import ops

from vit_keras import compat, configs, distillation, distribute, kernels
from vit_keras.weights.files import load_model, portable_jit_compile

__all__ = ["RECIPES", "FinalPatchDropRate", "HistoryFile", "KeptCheckpoints", "LastModel",
           "LayerwiseAdamW", "LayerwiseRates", "LayerwiseSGD", "Recipe", "WarmupSchedule",
           "callbacks", "compile_distiller", "compile_model", "layer_rates", "make_optimizer",
           "patch_drop_callbacks", "pipeline_options", "save_public_optimizer", "train",
           "with_options"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything about how a ViT is trained that is not the model's shape or the data, as
    one record, so that a recipe is data to compare, print and change (with_options) rather
    than code. RECIPES holds the paper's and this repository's.

    Args:
        optimizer: "adamw" or "sgd".
        learning_rate: the peak learning rate, reached after the warmup.
        schedule: "linear" or "cosine" decay after a linear warmup.
        warmup_steps: steps, or a fraction of all steps when below 1.
        weight_decay: decoupled weight decay, on kernels only; Keras multiplies it by the
            learning rate.
        beta_2: AdamW's second-moment decay.
        momentum: SGD's momentum.
        clipnorm: the gradients' global norm is clipped to this; None for no clipping.
        label_smoothing: of the cross-entropy's one-hot targets.
        dropout_rate: vk.vit's dropout_rate, for the apps that build the model.
        stochastic_depth_rate: vk.vit's stochastic_depth_rate, likewise.
        patch_drop_rate: vk.vit's patch_drop_rate: the patch tokens each training image
            leaves out.
        final_patch_drop_rate: the rate over the last final_patch_drop_epochs epochs (None:
            patch_drop_rate throughout): a few epochs on more of each image's patches fit the
            model to the whole grid it is evaluated on (FLIP's unmasked tuning, Li et al.
            2023).
        final_patch_drop_epochs: the epochs at final_patch_drop_rate.
        randaugment: (num_ops, magnitude in [0, 1]) of keras.layers.RandAugment; None for
            none.
        mixup_alpha: Mixup's alpha; 0 for none.
        cutmix_alpha: CutMix's alpha; 0 for none.
        ema_momentum: Polyak averaging of the weights at this momentum; None for none.
        gradient_accumulation_steps: steps whose gradients are summed before an update;
            None for none.
        crop: the training crop of data.make_pipeline: "inception", "padN" or "none".
        flip: random horizontal flips in training.
        test_time_flip: evaluation averages each image's logits with its mirror's, as a model
            trained on random flips sees both; apps.train reports the single view's accuracy
            beside it.
        layer_decay: fine-tuning's layer-wise rate decay (layer_rates): block i's rate times
            decay^(depth - i); None or 1 for none.
        head_lr_multiplier: fine-tuning: the head's rate times this.
        distillation: train with a teacher, DeiT's "hard" or "soft" objective
            (vit_keras.distillation); None for none.
        distillation_token: the student has DeiT's distillation token (vk.vit(distilled=True))
            and its head takes the teacher's term.
        distillation_temperature: soft distillation's tau.
        distillation_weight: soft distillation's lambda, the teacher term's weight.
        teacher: the teacher's .keras file, loaded by train() where no teacher model is given.
        source: where the recipe comes from (a paper and its table).

    Raises:
        ValueError: layer_decay outside (0, 1], head_lr_multiplier not positive, an
            unknown distillation, a temperature that is not positive, a distillation weight
            outside [0, 1], or a distillation token or teacher without a distillation.
    """

    optimizer: str
    learning_rate: float
    schedule: str
    warmup_steps: int | float
    weight_decay: float = 0.0
    beta_2: float = 0.999
    momentum: float = 0.9
    clipnorm: float | None = 1.0
    label_smoothing: float = 0.0
    dropout_rate: float = 0.0
    stochastic_depth_rate: float = 0.0
    patch_drop_rate: float = 0.0
    final_patch_drop_rate: float | None = None
    final_patch_drop_epochs: int = 1
    randaugment: tuple[int, float] | None = None
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    ema_momentum: float | None = None
    gradient_accumulation_steps: int | None = None
    crop: str = "inception"
    flip: bool = True
    test_time_flip: bool = False
    layer_decay: float | None = None
    head_lr_multiplier: float = 1.0
    distillation: str | None = None
    distillation_token: bool = False
    distillation_temperature: float = 3.0
    distillation_weight: float = 0.1
    teacher: str | None = None
    source: str = ""

    def __post_init__(self):
        if self.layer_decay is not None and not (_is_number(self.layer_decay)
                                                 and 0 < self.layer_decay <= 1):
            raise ValueError(f"layer_decay {self.layer_decay!r}: expected a number in (0, 1] "
                             "(1 or None: no decay)")
        if not (_is_number(self.head_lr_multiplier) and self.head_lr_multiplier > 0):
            raise ValueError(f"head_lr_multiplier {self.head_lr_multiplier!r}: expected a "
                             "positive number (1: the head trains at the base rate)")
        if self.distillation not in (None, *distillation.KINDS):
            raise ValueError(f"distillation {self.distillation!r}: expected one of "
                             f"{', '.join(distillation.KINDS)}, or None for none")
        if self.distillation_token and not self.distillation:
            raise ValueError("distillation_token=True needs a distillation ('hard' or 'soft'): "
                             "the token's head learns from the teacher")
        if not (_is_number(self.distillation_temperature) and self.distillation_temperature > 0):
            raise ValueError(f"distillation_temperature {self.distillation_temperature!r}: "
                             "expected a positive number (soft distillation's tau)")
        if not (_is_number(self.distillation_weight) and 0 <= self.distillation_weight <= 1):
            raise ValueError(f"distillation_weight {self.distillation_weight!r}: expected a "
                             "number in [0, 1] (soft distillation's lambda)")
        if self.teacher is not None and not self.distillation:
            raise ValueError(f"teacher {self.teacher!r} needs a distillation ('hard' or "
                             "'soft'): without one the teacher is not used")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    # The Fashion-MNIST reference run (scripts/main.sh): a small hybrid ViT, tuned for 2 CPU
    # cores; its 16 tokens all train (docs/performance.md has its results).
    "fashion_mnist": Recipe("adamw", 3e-3, "cosine", 0.05, weight_decay=0.05,
                            crop="none", flip=True, test_time_flip=True,
                            source="this repository (the Fashion-MNIST reference run)"),
}
"""The recipes by name: the paper's pre-training ("pretrain"), fine-tuning ("finetune") and
masked patch prediction ("mpp"), DeiT's training from scratch on small data ("scratch"), and
this repository's Fashion-MNIST recipe ("fashion_mnist"); each names its source."""


def with_options(recipe: Recipe, options: list[str]) -> Recipe:
    """A recipe with some fields changed, from "field=value" text as the apps'
    --recipe-option gives it.

    Args:
        recipe: the recipe to start from.
        options: "field=value" strings; a value is read as a Python literal, else kept as a
            string.

    Returns:
        A new Recipe.

    Raises:
        ValueError: an option without "=" or naming no field of Recipe.
    """
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
    crop, flip, RandAugment (on uint8-range values), Mixup and CutMix.

    Args:
        recipe: the training recipe.

    Returns:
        A dict to pass as make_pipeline(**pipeline_options(recipe)).
    """
    augment = ()
    if recipe.randaugment:
        num_ops, magnitude = recipe.randaugment
        augment = (keras.layers.RandAugment(value_range=(0, 255), num_ops=num_ops,
                                            factor=magnitude),)
    return dict(crop=recipe.crop, flip=recipe.flip, augment=augment,
                mixup_alpha=recipe.mixup_alpha, cutmix_alpha=recipe.cutmix_alpha)


@keras.saving.register_keras_serializable(package="vit_keras")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to peak over warmup_steps, then linear or cosine decay to end, as
    the paper's recipes schedule the learning rate.

    Args:
        peak: the rate at the end of the warmup.
        total_steps: the steps of the whole run.
        warmup_steps: the steps of the warmup, below total_steps.
        decay: "linear" or "cosine".
        end: the rate at the last step.

    Raises:
        ValueError: an unknown decay, or warmup_steps outside [0, total_steps).
    """

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
    class token or position embeddings), as big_vision does. With the recipe's layer_decay or
    head_lr_multiplier, the optimizer scales each variable's rate by layer_rates.

    Args:
        recipe: the training recipe.
        model: the model it trains (for the variables that take no decay, and the rates).
        total_steps: the steps of the run, for the schedule.
        learning_rate: overrides the recipe's peak rate.

    Returns:
        The keras.optimizers.Optimizer.

    Raises:
        ValueError: an unknown optimizer, or layer rates the model cannot take.
    """
    schedule = WarmupSchedule(learning_rate or recipe.learning_rate, total_steps,
                              warmup_steps(recipe, total_steps), recipe.schedule)
    common = dict(learning_rate=schedule, global_clipnorm=recipe.clipnorm,
                  use_ema=recipe.ema_momentum is not None,
                  ema_momentum=recipe.ema_momentum or 0.99,
                  gradient_accumulation_steps=recipe.gradient_accumulation_steps)
    if recipe.layer_decay not in (None, 1) or recipe.head_lr_multiplier != 1:
        classes = dict(adamw=LayerwiseAdamW, sgd=LayerwiseSGD)
        common["rate_multipliers"] = layer_rates(model, recipe.layer_decay,
                                                 recipe.head_lr_multiplier)
    else:
        classes = dict(adamw=keras.optimizers.AdamW, sgd=keras.optimizers.SGD)
    if recipe.optimizer == "adamw":
        optimizer = classes["adamw"](weight_decay=recipe.weight_decay, beta_1=0.9,
                                     beta_2=recipe.beta_2, **common)
        optimizer.exclude_from_weight_decay(var_list=no_decay_variables(model))
    elif recipe.optimizer == "sgd":
        optimizer = classes["sgd"](momentum=recipe.momentum, **common)
    else:
        raise ValueError(f"unknown optimizer {recipe.optimizer!r}: expected 'adamw' or 'sgd'")
    kernels.clip_by_global_norm_fused(optimizer)
    kernels.adam_update_fused(optimizer)
    return optimizer


def layer_rates(model: keras.Model, layer_decay: float | None = None,
                head_multiplier: float = 1.0) -> dict[str, float]:
    """Each trainable variable's learning-rate multiplier, by variable path (those other than
    1), for layer-wise rate decay as MAE and BEiT fine-tune (facebookresearch/mae
    util/lr_decay.py, after BEiT's optim_factory.py): of a model with L encoder blocks, the
    layers it runs before its first block (patch embedding, class and other tokens, position
    embedding, a hybrid's ResNet stem) are layer 0, block i (from 0) is layer i + 1, and the
    layers after the blocks (final norm, pre_logits, head) are layer L + 1; layer j's rate is
    scaled by decay^(L + 1 - j). So block i trains at decay^(L - i), the embeddings at
    decay^(L + 1), the final norm and head at the full rate; the head (head, head_dist) then
    also times head_multiplier. timm's param_groups_layer_decay differs in one place: it counts
    the final norm with the last block (decay^1).

    Args:
        model: a vk.vit model.
        layer_decay: the decay per layer, in (0, 1]; None for none.
        head_multiplier: the head's extra multiplier.

    Returns:
        {variable path: multiplier} for every trainable variable whose multiplier is not 1.

    Raises:
        ValueError: a decay for a model without named encoder blocks, or a head multiplier for
            a model without a head.
    """
    decay = layer_decay or 1.0
    blocks = {layer.name: int(layer.name[len(configs.BLOCK_PREFIX):]) for layer in model.layers
              if re.fullmatch(re.escape(configs.BLOCK_PREFIX) + r"\d+", layer.name)}
    names = [layer.name for layer in model.layers]
    if decay != 1 and not blocks:
        raise ValueError(f"layer_decay needs a model whose encoder blocks are layers named "
                         f"{configs.block_name(0)}, ...; model {model.name!r} has none")
    heads = {configs.HEAD, configs.HEAD_DIST} & set(names)
    if head_multiplier != 1 and not heads:
        raise ValueError(f"head_lr_multiplier needs a model with a layer named "
                         f"{configs.HEAD!r}; model {model.name!r} has none (include_top=False?)")
    depth = len(blocks)
    first_block = min((names.index(name) for name in blocks), default=len(names))
    rates = {}
    for position, layer in enumerate(model.layers):
        if layer.name in blocks:
            layer_id = blocks[layer.name] + 1
        else:
            layer_id = 0 if position < first_block else depth + 1
        rate = decay ** (depth + 1 - layer_id) * (head_multiplier if layer.name in heads else 1)
        rates.update({variable.path: rate for variable in layer.trainable_weights
                      if rate != 1})
    return rates


class LayerwiseRates(compat.OptimizerHooks):
    """For a Keras optimizer class: each variable's learning rate times its multiplier
    (rate_multipliers, by variable path; 1 for the rest). Keras 3 optimizers take one rate for
    all variables; this one groups the variables by multiplier and runs its optimizer's own
    update on each group with the rate scaled, so each backend's update path and gradient
    accumulation stay Keras' own. Decoupled weight decay scales with the rate too (Keras
    multiplies it by the rate, as timm's parameter groups do), and the multipliers are saved
    with the optimizer in .keras files.

    Args:
        *args: the optimizer class's arguments.
        rate_multipliers: {variable path: multiplier} (layer_rates); a variable not named
            trains at the base rate.
        **kwargs: the optimizer class's arguments.

    Raises:
        ValueError: at build, a multiplier for a variable the optimizer does not train.
    """

    def __init__(self, *args, rate_multipliers: dict[str, float] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.rate_multipliers = dict(rate_multipliers or {})
        self._rate_scale = 1.0

    def build(self, variables):
        super().build(variables)
        unknown = sorted(set(self.rate_multipliers) - {v.path for v in variables})
        if unknown:
            raise ValueError(f"rate multipliers for {len(unknown)} variable(s) the optimizer "
                             f"does not train, e.g. {unknown[0]!r}")
        self._multipliers = [self.rate_multipliers.get(v.path, 1.0) for v in variables]

    def _groups(self, variables, values=None):
        """[(multiplier, its variables, their values)] in the order multipliers first occur."""
        groups = {}
        for index, variable in enumerate(variables):
            multiplier = self._multipliers[compat.variable_index(self, variable)]
            groups.setdefault(multiplier, []).append(index)
        return [(multiplier, [variables[i] for i in indices],
                 [values[i] for i in indices] if values is not None else None)
                for multiplier, indices in groups.items()]

    def rate_scale(self):
        return self._rate_scale

    def weight_decay_step(self, variables):
        if self.weight_decay is None:
            return
        decayed = [variable for variable in variables if self.uses_weight_decay(variable)]
        for multiplier, group, _ in self._groups(decayed):
            self._rate_scale = multiplier  # Keras' weight decay reads the current rate
            try:
                self.keras_weight_decay_step(group)
            finally:
                self._rate_scale = 1.0

    def update_variables(self, grads, variables, learning_rate):
        for multiplier, group, group_grads in self._groups(variables, grads):
            self.keras_update_variables(
                group_grads, group, learning_rate if multiplier == 1 else
                learning_rate * multiplier)

    def get_config(self):
        return {**super().get_config(), "rate_multipliers": dict(self.rate_multipliers)}


# Built on the class Keras itself runs for AdamW and SGD on this backend (PyTorch's
# multi-tensor versions there), so that each rate group takes the update Keras' own optimizer
# would, and make_optimizer's fast paths (kernels.adam_update_fused) apply per group.
@keras.saving.register_keras_serializable(package="vit_keras")
class LayerwiseAdamW(LayerwiseRates, compat.keras_optimizer_class(keras.optimizers.AdamW)):
    """AdamW with a learning-rate multiplier per variable (LayerwiseRates)."""


@keras.saving.register_keras_serializable(package="vit_keras")
class LayerwiseSGD(LayerwiseRates, compat.keras_optimizer_class(keras.optimizers.SGD)):
    """SGD with a learning-rate multiplier per variable (LayerwiseRates)."""


def no_decay_variables(model: keras.Model) -> list:
    return [v for v in model.trainable_variables if not v.name.endswith("kernel")]


def compile_model(model: keras.Model, recipe: Recipe, total_steps: int,
                  learning_rate: float | None = None, jit_compile: bool | str = "auto",
                  steps_per_execution: int = 1) -> keras.Model:
    """model.compile for the recipe: its optimizer and schedule, cross-entropy on one-hot
    labels (what make_pipeline emits) with its label smoothing, top-1 and top-5 accuracy.

    Args:
        model: the classifier to compile.
        recipe: the training recipe.
        total_steps: the steps of the run, for the schedule.
        learning_rate: overrides the recipe's peak rate.
        jit_compile: model.compile's, Keras' "auto" unless the caller chooses.
        steps_per_execution: model.compile's.

    Returns:
        The compiled model (save_public_optimizer); model.save writes its jit_compile as
        "auto" (weights.files.portable_jit_compile), whatever it runs with.
    """
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
    return portable_jit_compile(save_public_optimizer(model))


def compile_distiller(model: keras.Model, recipe: Recipe, total_steps: int,
                      learning_rate: float | None = None, teacher: keras.Model | None = None,
                      jit_compile: bool | str = "auto",
                      steps_per_execution: int = 1) -> keras.distillation.Distiller:
    """The keras.distillation.Distiller that trains `model` with the recipe's teacher term
    (vit_keras.distillation.distiller), compiled as compile_model compiles a classifier: the
    recipe's optimizer over the model's weights, the label term on the class head with the
    recipe's label smoothing, and top-1 and top-5 accuracy of what the model answers with.

    Args:
        model: the vk.vit student; distilled=True exactly when recipe.distillation_token.
        recipe: a training recipe with a distillation.
        total_steps: the steps of the run, for the schedule.
        learning_rate: overrides the recipe's peak rate.
        teacher: the teacher; None to load recipe.teacher's .keras file.
        jit_compile: model.compile's.
        steps_per_execution: model.compile's.

    Returns:
        The compiled Distiller: fit it; `model` holds the trained weights.

    Raises:
        ValueError: a recipe without distillation or teacher, or a model whose distillation
            token does not match the recipe's.
    """
    if not recipe.distillation:
        raise ValueError("compile_distiller needs a recipe with distillation 'hard' or 'soft'")
    if recipe.distillation_token != distillation.has_distillation_token(model):
        raise ValueError(f"the recipe's distillation_token is {recipe.distillation_token} but "
                         f"the model {model.name!r} "
                         f"{'has' if not recipe.distillation_token else 'has no'} "
                         "distillation token: expected vk.vit(..., distilled="
                         f"{recipe.distillation_token})")
    if teacher is None:
        if recipe.teacher is None:
            raise ValueError(f"distillation {recipe.distillation!r} needs a teacher: pass one, "
                             "or name its .keras file in the recipe's teacher")
        teacher = load_model(recipe.teacher, compile=False)
    distiller = distillation.distiller(model, teacher, recipe.distillation,
                                       recipe.distillation_temperature,
                                       recipe.distillation_weight)
    distiller.compile(
        optimizer=make_optimizer(recipe, model, total_steps, learning_rate),
        loss=distillation.ClassHeadLoss(recipe.label_smoothing),
        metrics=[keras.metrics.MeanMetricWrapper(
                     distillation.served_metric, name="accuracy",
                     metric=keras.metrics.categorical_accuracy),
                 keras.metrics.MeanMetricWrapper(
                     distillation.served_metric, name="top5",
                     metric=keras.metrics.top_k_categorical_accuracy,
                     k=min(5, model.outputs[0].shape[-1]))],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return distiller


def save_public_optimizer(model: keras.Model) -> keras.Model:
    """The compiled model, its saved compile state naming the optimizer's public Keras class.
    On PyTorch, Keras swaps in a class of its torch backend and saves that module's name; a
    process on another backend then imports the torch backend to load the file, which crashes
    one that loaded TensorFlow first. Each backend maps the public class to its own. (A file
    loaded with its compile state on PyTorch and saved again names the torch class again:
    Keras' own compile runs on loading.)

    Args:
        model: a compiled model.

    Returns:
        The same model.
    """
    # The optimizer as compile received it (model.optimizer may wrap it, for loss scaling),
    # in the dict Keras serializes at saving.
    compiled = compat.compile_config(model)
    optimizer = compiled["optimizer"]
    if compat.is_backend_optimizer(optimizer):
        config = keras.optimizers.serialize(optimizer)
        config.update(module="keras.optimizers", registered_name=None)
        compiled["optimizer"] = config
    return model


class HistoryFile(keras.callbacks.Callback):
    """The epoch logs as JSON (and CSV beside it), keyed by epoch and rewritten atomically
    after each one, so a run resumed by BackupAndRestore ends with one complete history (no
    gaps, no repeats). Each epoch also records its wall-clock epoch_seconds (training and any
    evaluation), measured here rather than read off a progress bar. Place it before
    BackupAndRestore in the callback list.

    Args:
        path: the JSON file; the CSV is written beside it with a .csv suffix.
    """

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.epoch_started = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_started = time.perf_counter()

    def read(self) -> dict[int, dict]:
        """The history written so far: {epoch (from 0): that epoch's logs}; empty before the
        first epoch."""
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


class _SavesModel(keras.callbacks.Callback):
    """A callback that writes a model file: of the model fit trains, or of `saved` where
    given (a distiller's student, without its teacher)."""

    def __init__(self, saved: keras.Model | None = None):
        super().__init__()
        self.saved = saved

    def model_to_save(self) -> keras.Model:
        fitted = self.model  # on JAX, reading it writes the trained state into the variables
        return fitted if self.saved is None else self.saved


class LastModel(_SavesModel):
    """The model after each epoch as one file, replaced each epoch.

    Args:
        path: the .keras file.
        saved: the model to save; None for the model fit trains.
    """

    def __init__(self, path: str, saved: keras.Model | None = None):
        super().__init__(saved)
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        self.model_to_save().save(self.path)


class KeptCheckpoints(_SavesModel):
    """The model after each epoch as folder/epoch-NNN.keras (epochs counted from 1), the
    newest `keep` of them kept and older ones removed, across resumed runs too.

    Args:
        folder: where the checkpoints go.
        keep: how many of the newest to keep, at least 1.
        saved: the model to save; None for the model fit trains.

    Raises:
        ValueError: keep below 1 or not a whole number.
    """

    def __init__(self, folder: str, keep: int, saved: keras.Model | None = None):
        super().__init__(saved)
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep_checkpoints {keep!r}: expected a whole number of at least 1")
        self.folder, self.keep = folder, keep

    def saved_files(self) -> list[str]:
        """The checkpoints in the folder, oldest first."""
        found = [name for name in os.listdir(self.folder)
                 if re.fullmatch(r"epoch-\d+\.keras", name)] if os.path.isdir(self.folder) else []
        return [os.path.join(self.folder, name)
                for name in sorted(found, key=lambda name: int(name[6:-6]))]

    def on_epoch_end(self, epoch, logs=None):
        os.makedirs(self.folder, exist_ok=True)
        self.model_to_save().save(os.path.join(self.folder, f"epoch-{epoch + 1:03d}.keras"))
        for path in self.saved_files()[:-self.keep]:
            os.remove(path)


class FinalPatchDropRate(keras.callbacks.Callback):
    """Sets the model's PatchDropout layer to `rate` from epoch `first_epoch` (from 0) on, and
    has model.fit trace its training step anew for the new token count. A resumed run sets it
    again at its first epoch.

    Args:
        rate: the patch dropout rate from first_epoch on.
        first_epoch: the epoch (from 0) the rate changes at.
    """

    def __init__(self, rate: float, first_epoch: int):
        super().__init__()
        self.rate, self.first_epoch = rate, first_epoch

    def on_epoch_begin(self, epoch, logs=None):
        layer = self.model.get_layer(configs.PATCH_DROPOUT)
        if epoch >= self.first_epoch and layer.rate != self.rate:
            layer.rate = self.rate
            self.model.make_train_function(force=True)


def patch_drop_callbacks(recipe: Recipe, model: keras.Model,
                         epochs: int) -> list[keras.callbacks.Callback]:
    """The recipe's change of patch dropout rate for its last epochs, if it has one.

    Args:
        recipe: the training recipe.
        model: the model, built with patch dropout where the recipe changes its rate.
        epochs: the run's epochs.

    Returns:
        [FinalPatchDropRate], or an empty list for a recipe without final_patch_drop_rate.

    Raises:
        ValueError: a model without patch dropout, or a final rate or epoch count out of
            range.
    """
    if recipe.final_patch_drop_rate is None:
        return []
    if configs.PATCH_DROPOUT not in {layer.name for layer in model.layers}:
        raise ValueError(f"final_patch_drop_rate {recipe.final_patch_drop_rate} needs a model "
                         f"built with patch dropout (vk.vit(patch_drop_rate=...)); model "
                         f"{model.name!r} has no layer {configs.PATCH_DROPOUT!r}")
    if not (_is_number(recipe.final_patch_drop_rate) and 0 <= recipe.final_patch_drop_rate < 1):
        raise ValueError(f"final_patch_drop_rate {recipe.final_patch_drop_rate!r}: expected a "
                         "number in [0, 1)")
    if not 0 < recipe.final_patch_drop_epochs <= epochs:
        raise ValueError(f"final_patch_drop_epochs {recipe.final_patch_drop_epochs!r}: expected "
                         f"1 to the run's {epochs} epochs")
    return [FinalPatchDropRate(recipe.final_patch_drop_rate,
                               epochs - recipe.final_patch_drop_epochs)]


def callbacks(run_dir: str, tensorboard: bool = True, keep_checkpoints: int = 1,
              saved: keras.Model | None = None) -> list[keras.callbacks.Callback]:
    """Checkpoint, resume, logs and NaN guard for a run kept in run_dir: last.keras is the
    latest epoch's model; keep_checkpoints above 1 also keeps the last that many epochs' models
    in run_dir/checkpoints (KeptCheckpoints). Resuming reads run_dir/backup.

    Args:
        run_dir: the run's folder, made if missing.
        tensorboard: also write TensorBoard logs to run_dir/logs.
        keep_checkpoints: the epochs whose models the run keeps.
        saved: the model the model files hold; None for the model fit trains.

    Returns:
        The callbacks for model.fit: TerminateOnNaN, HistoryFile, BackupAndRestore,
        LastModel, and KeptCheckpoints and TensorBoard where asked.
    """
    os.makedirs(run_dir, exist_ok=True)
    found = [
        keras.callbacks.TerminateOnNaN(),
        HistoryFile(os.path.join(run_dir, "history.json")),
        # double_checkpoint: a kill during the weights write leaves the previous backup to
        # resume from (seen here: SIGKILL mid-save left an unreadable .h5).
        keras.callbacks.BackupAndRestore(os.path.join(run_dir, "backup"),
                                         double_checkpoint=True),
        LastModel(os.path.join(run_dir, "last.keras"), saved),
    ]
    if keep_checkpoints != 1:
        found.append(KeptCheckpoints(os.path.join(run_dir, "checkpoints"), keep_checkpoints,
                                     saved))
    if tensorboard:
        found.append(keras.callbacks.TensorBoard(os.path.join(run_dir, "logs")))
    return found


def train(model: keras.Model, recipe: Recipe, train_data, *, epochs: int, steps_per_epoch: int,
          run_dir: str, validation_data=None, validation_freq: int = 1,
          learning_rate: float | None = None,
          distribution=None, jit_compile: bool | str = "auto", steps_per_execution: int = 1,
          verbose="auto", compile=compile_model, keep_checkpoints: int = 1,
          teacher: keras.Model | None = None) -> dict[int, dict]:
    """model.fit with the recipe's optimizer and the resumable callbacks: the same call after
    an interruption resumes from the last finished epoch in run_dir. A recipe with a
    distillation trains through compile_distiller's Distiller, and the run's model files hold
    the student alone.

    Args:
        model: the model, built in distribution's scope.
        recipe: the training recipe.
        train_data: the training batches (data.make_pipeline), repeated as model.fit needs
            for epochs * steps_per_epoch steps.
        epochs: the epochs to train.
        steps_per_epoch: the steps of one epoch.
        run_dir: the run's folder: checkpoints, backup, history and logs (callbacks).
        validation_data: batches to evaluate on during training; None for none.
        validation_freq: evaluate every this many epochs.
        learning_rate: overrides the recipe's peak rate.
        distribution: a vit_keras.distribute.Distribution whose scope the model was built in;
            None for one device.
        jit_compile: model.compile's.
        steps_per_execution: model.compile's.
        verbose: model.fit's.
        compile: compile_model's signature; another objective's
            (masked.compile_masked_patch_model) for models that are not classifiers.
        keep_checkpoints: the epochs whose models the run keeps (callbacks).
        teacher: the recipe's distillation's teacher; None to load recipe.teacher's file (in
            the distribution's scope).

    Returns:
        The complete per-epoch history, {epoch: logs}, epochs run before an interruption
        included.

    Raises:
        ValueError: a teacher given with a recipe that has no distillation.
    """
    if teacher is not None and not recipe.distillation:
        raise ValueError("a teacher needs a recipe with distillation 'hard' or 'soft': "
                         "without one the teacher is not used")
    distribution = distribution or distribute.choose("none")
    options = dict(jit_compile=jit_compile, steps_per_execution=steps_per_execution)
    with distribution.scope():
        if recipe.distillation:
            fitted = compile_distiller(model, recipe, epochs * steps_per_epoch, learning_rate,
                                       teacher, **options)
        else:
            fitted = compile(model, recipe, epochs * steps_per_epoch, learning_rate, **options)
    portable_jit_compile(model)  # whatever `compile` is: the checkpoints say "auto"
    distribute.prepare_model(fitted, distribution)
    run_callbacks = callbacks(run_dir, keep_checkpoints=keep_checkpoints, saved=model)
    fitted.fit(train_data, epochs=epochs, steps_per_epoch=steps_per_epoch, shuffle=False,
               validation_data=validation_data, validation_freq=validation_freq,
               callbacks=patch_drop_callbacks(recipe, model, epochs) + run_callbacks,
               verbose=verbose)
    return next(c for c in run_callbacks if isinstance(c, HistoryFile)).read()
