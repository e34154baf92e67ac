"""Canonical (pre-Linen .npz) arrays onto a model: every checkpoint layout is first rewritten
to the flat names of the vit_jax / AugReg files, then loading is a name map. A checkpoint is
checked completely before anything is assigned, so a bad file changes nothing.

Variables are found by their layer names (vit_keras.configs), not by layer classes.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import keras
import numpy as np

from vit_keras import compat, configs
from vit_keras.weights.resample import (
    adapt_posemb,
    resample_grid,
    resample_offsets,
    source_grid,
)

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
# learned2d's tables: one axis each, (rows or columns, D/2).
AXIS_POSEMB_KEYS = ("Transformer/posembed_input/row_embedding",
                    "Transformer/posembed_input/col_embedding")
# posemb="relative": each block's table of offsets between patches (2N - 1, heads, D_h).
RELATIVE_KEY = re.compile(r"MultiHeadDotProductAttention_1/relative_embedding$")
# The prefix tokens a position embedding covers (class, DeiT's distillation), in order.
EMBEDDED_PREFIX = ("cls", "dist_token/tokens")
# The heads a new task replaces: the paper's, and DeiT's second (distilled=True).
HEAD_KEYS = ("head/kernel", "head/bias", "head_dist/kernel", "head_dist/bias")
BLOCK_KEY = re.compile(r"^Transformer/encoderblock_(\d+)/")
# Parts that only some models have, by vk.vit() option: (key pattern, what the part is, the
# option that gives a model the part, the option that leaves it out).
MODEL_OPTIONS = (
    (re.compile(r"/LayerScale_\d/scale$"), "LayerScale", "layer_scale=<any float>",
     "layer_scale=None"),
    (re.compile(r"MultiHeadDotProductAttention_1/(query|key|value)/bias$"),
     "query/key/value biases", "qkv_bias=True", "qkv_bias=False"),
    (re.compile(r"(MultiHeadDotProductAttention_1/out|MlpBlock_3/Dense_\d)/bias$"),
     "attention-output and MLP biases", "proj_bias=True", "proj_bias=False"),
    (re.compile(r"MultiHeadDotProductAttention_1/(query|key)_norm/scale$"),
     "query/key normalisation", "qk_norm=True", "qk_norm=False"),
    (re.compile(r"^Transformer/pre_norm/scale$"), "a LayerNorm before the blocks",
     "pre_norm=True", "pre_norm=False"),
    (re.compile(r"^embedding/bias$"), "a patch-embedding bias", "pre_norm=False",
     "pre_norm=True"),
    (re.compile(r"^fc_norm/scale$"), "a LayerNorm after pooling", "fc_norm=True",
     "fc_norm=False"),
    (re.compile(r"^registers/tokens$"), "register tokens", "num_register_tokens=<the count>",
     "num_register_tokens=0"),
    (re.compile(r"^dist_token/tokens$"), "DeiT's distillation token", "distilled=True",
     "distilled=False"),
    (re.compile(r"MultiHeadDotProductAttention_1/(prefix_)?relative_embedding$"),
     "relative position embeddings", "posemb='relative'",
     "the checkpoint's posemb ('learned' for the official ones)"),
)


@dataclasses.dataclass
class LoadReport:
    """What a load did, key by key, so that the caller is told about every array that was not
    a plain copy (str() gives it in a few lines). Keys are the checkpoint's canonical names
    (the official .npz tree).

    Args:
        source: the file or object the weights came from.
        layout: the checkpoint's layout ("official .npz", "timm", a keras-hub ViT, ...).
        loaded: the keys copied into the model, resampled ones included.
        resampled: key -> how it was fitted to the model (position embeddings of another
            grid).
        reinitialised: the head's keys set to zero because the checkpoint's head does not fit
            the model (a new task's head, the fine-tuning convention).
        dropped: the checkpoint's keys that the model has no place for by its options (a
            head, pre_logits or class token it was built without).
        unused: any other key of the checkpoint the model did not take (also warned about).
    """

    source: str
    layout: str
    loaded: list[str] = dataclasses.field(default_factory=list)
    resampled: dict[str, str] = dataclasses.field(default_factory=dict)
    reinitialised: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)
    unused: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.source}: {self.layout} layout, {len(self.loaded)} arrays loaded"]
        lines += [f"  resampled {k}: {v}" for k, v in self.resampled.items()]
        if self.reinitialised:
            lines.append(f"  zero-initialised (new head): {', '.join(self.reinitialised)}")
        if self.dropped:
            lines.append(f"  dropped (the model has no place for them): {', '.join(self.dropped)}")
        if self.unused:
            lines.append(f"  unused keys: {', '.join(self.unused)}")
        return "\n".join(lines)


def num_embedded_prefix(params) -> int:
    """How many prefix tokens of a checkpoint its position embedding covers."""
    return sum(key in params for key in EMBEDDED_PREFIX)


def num_blocks(keys) -> int:
    indices = {int(m.group(1)) for k in keys if (m := BLOCK_KEY.match(k))}
    return max(indices) + 1 if indices else 0


def model_variables(model: keras.Model) -> dict[str, keras.Variable]:
    """The model's variables under their canonical checkpoint names; LoRA adapters are not
    checkpoint weights and are left out (merged_kernels has what they add)."""
    named = {}
    for layer in model.layers:
        scope = configs.checkpoint_name(layer.name)
        for variable in layer.weights:
            if "lora_kernel" in variable.path:
                continue
            parts = variable.path.split("/")[1:] if "/" in variable.path else [variable.name]
            parts[-1] = {"gamma": "scale", "beta": "bias"}.get(parts[-1], parts[-1])
            key = "cls" if layer.name == configs.CLASS_TOKEN else "/".join([scope, *parts])
            named[key] = variable
    return named


def merged_kernels(model: keras.Model) -> dict[str, object]:
    """{kernel variable path: kernel with its LoRA adapters added} for every layer that has
    LoRA enabled (Keras' Dense and EinsumDense compute that sum as their `kernel`)."""
    return {compat.base_kernel(layer).path: layer.kernel for layer in compat.flatten_layers(model)
            if getattr(layer, "lora_enabled", False)}


def _check_options(targets, params, source) -> None:
    """A ValueError naming the vk.vit() option when model and checkpoint differ in a part
    that only some models have (loading without it would compute something else)."""
    for pattern, part, with_part, without_part in MODEL_OPTIONS:
        in_model = [k for k in targets if pattern.search(k)]
        in_checkpoint = [k for k in params if pattern.search(k)]
        if in_checkpoint and not in_model:
            raise ValueError(f"{source}: the checkpoint has {part} ({in_checkpoint[0]!r}), the "
                             f"model has not; build it with {with_part}")
        if in_model and not in_checkpoint:
            raise ValueError(f"{source}: the model has {part} ({in_model[0]!r}), the "
                             f"checkpoint has not; build it with {without_part}")


def _check_head_input(targets, params, source) -> None:
    """A head is loaded only onto the representation it was trained on: a checkpoint's head
    that reads a pre_logits layer would read the pooled tokens of a model without one."""
    if f"{configs.PRE_LOGITS}/kernel" in params and f"{configs.PRE_LOGITS}/kernel" not in targets:
        width = params[f"{configs.PRE_LOGITS}/kernel"].shape[-1]
        raise ValueError(f"{source}: the checkpoint's head reads a pre_logits layer of width "
                         f"{width}, the model has none; build it with representation_size="
                         f"{width}, or with another num_classes for a new head")


def _fit_posemb(model, value, ckpt_prefix, resample):
    layer = model.get_layer(configs.POSITION_EMBEDDING)
    return adapt_posemb(value, ckpt_prefix, layer.grid_size, layer.num_prefix_tokens, resample)


def _fit_offsets(model, key, value, grid):
    """A checkpoint's relative-position table fitted to the model's grid (resample_offsets):
    the checkpoint's grid is `grid` where the file records it, else inferred from the
    table's size (source_grid). Returns the table and a note (None if unchanged)."""
    model_grid = model.get_layer(configs.POSITION_EMBEDDING).grid_size
    built = tuple(grid) if grid else source_grid((len(value) + 1) // 2, model_grid)
    if len(value) != 2 * built[0] * built[1] - 1:
        raise ValueError(f"{key!r} has {len(value)} offsets, the {built[0]}x{built[1]} grid "
                         f"the file records has {2 * built[0] * built[1] - 1}")
    if built == tuple(model_grid):
        return value, None
    return resample_offsets(value, built, model_grid), (
        f"grid {built[0]}x{built[1]} -> {model_grid[0]}x{model_grid[1]} offsets (per axis)")


def load_params(model: keras.Model, params: dict[str, np.ndarray], source: str,
                layout: str, grid_only_posemb: bool = False,
                resample: str = "zoom", grid: tuple[int, int] | None = None) -> LoadReport:
    """Loads canonical (pre-Linen) arrays into the model; checks all before assigning any.
    grid: the (rows, columns) of patches the checkpoint's relative-position tables are
    built for, where the file records it (a .keras model); None infers it."""
    report = LoadReport(source=source, layout=layout)
    targets = model_variables(model)
    model_blocks, ckpt_blocks = num_blocks(targets), num_blocks(params)
    if model_blocks != ckpt_blocks:
        raise ValueError(f"{source}: checkpoint has {ckpt_blocks} encoder blocks, the model has "
                         f"{model_blocks}")
    _check_options(targets, params, source)
    values = {}
    for key, variable in targets.items():
        expected = tuple(variable.shape)
        if key in HEAD_KEYS:
            continue
        if key not in params:
            raise ValueError(f"{source}: key {key!r} is missing from the checkpoint "
                             f"(the model needs shape {expected})")
        value = params[key].astype("float32")
        if key == POSEMB_KEY:
            ckpt_prefix = 0 if grid_only_posemb else num_embedded_prefix(params)
            value, note = _fit_posemb(model, value, ckpt_prefix, resample)
            if note:
                report.resampled[key] = note
        if key in AXIS_POSEMB_KEYS and value.shape[0] != expected[0]:
            report.resampled[key] = f"{value.shape[0]} -> {expected[0]} positions ({resample})"
            value = resample_grid(value[:, None], (expected[0], 1), resample)[:, 0]
        if RELATIVE_KEY.search(key):
            value, note = _fit_offsets(model, key, value, grid)
            if note:
                report.resampled[key] = note
        if tuple(value.shape) != expected:
            raise ValueError(f"{source}: shape mismatch for {key!r}: the model expects "
                             f"{expected}, the checkpoint has {tuple(value.shape)}")
        values[key] = value
    heads = [k for k in HEAD_KEYS if k in targets]
    if heads:
        head_shapes = [tuple(targets[k].shape) for k in heads]
        found = [tuple(params[k].shape) for k in HEAD_KEYS if k in params]
        if found == head_shapes:
            _check_head_input(targets, params, source)
            values.update({k: params[k].astype("float32") for k in heads})
        else:
            values.update({k: np.zeros(targets[k].shape, "float32") for k in heads})
            report.reinitialised = heads
            warnings.warn(f"{source}: head {found or 'absent'} does not fit the model's "
                          f"{head_shapes}; the head is zero-initialised (fine-tuning convention)",
                          stacklevel=3)
    for key, value in values.items():
        targets[key].assign(value)
    report.loaded = sorted(set(values) - set(report.reinitialised))
    used = set(values) - set(report.reinitialised)
    leftover = sorted(set(params) - used)
    report.dropped = [k for k in leftover
                      if k.startswith(("pre_logits/", "head/", "head_dist/")) or k == "cls"]
    report.unused = [k for k in leftover if k not in report.dropped]
    if report.unused:
        warnings.warn(f"{source}: unused keys {report.unused}", stacklevel=3)
    return report
