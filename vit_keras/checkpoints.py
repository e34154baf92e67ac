"""Official .npz checkpoints in and out, and position-embedding resampling.

Every layout is first rewritten to one canonical form, the flat pre-Linen names of the
vit_jax / AugReg files (facts section 3); loading is then a name map onto the model. A
checkpoint is checked completely before anything is assigned, so a bad file changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
import zipfile

import keras
import numpy as np
import scipy.ndimage

from vit_keras.layers import AddPositionEmbedding, ClassToken
from vit_keras.models import checkpoint_name

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
HEAD_KEYS = ("head/kernel", "head/bias")
_PREFIXES = ("opt/target/", "params/img/", "params/")
# Linen / big_vision sub-module names -> the pre-Linen names of the vit_jax files.
_LINEN_TO_PRE_LINEN = {"MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
                       "LayerNorm_1": "LayerNorm_2", "MlpBlock_0": "MlpBlock_3"}
_BLOCK = re.compile(r"^Transformer/encoderblock_(\d+)/")
_GROUP_NORM = re.compile(r"(^|/)gn(\d+|_root|_proj)/(scale|bias)$")


@dataclasses.dataclass
class LoadReport:
    """What a load did: the caller is told about every key that was not a plain copy."""

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


# ---------------------------------------------------------------- reading and layouts


def read_npz(path: str) -> dict[str, np.ndarray]:
    """All arrays of an .npz file, refusing pickled objects."""
    path = os.fspath(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path!r} is not an .npz file (expected a zip archive of .npy arrays)")
    with np.load(path, allow_pickle=False) as archive:
        params = {}
        for key in archive.files:
            try:
                params[key] = archive[key]
            except ValueError as err:
                raise ValueError(f"{path!r}: array {key!r} holds pickled Python objects; "
                                 "refusing to load it (allow_pickle=False)") from err
    return params


def canonicalize(params: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str, bool]:
    """Rewrites any known layout to pre-Linen names.

    Returns (params, layout description, grid_only_posemb): big_vision files keep the
    position embedding of the patch grid only, without the class token's row.
    """
    layout = []
    prefix = next((p for p in _PREFIXES if f"{p}embedding/kernel" in params), "")
    if prefix:
        layout.append(f"'{prefix}' prefix")
        params = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
    params = dict(params)
    grid_only = "pos_embedding" in params
    if grid_only:
        layout.append("big_vision grid-only position embedding")
        params[POSEMB_KEY] = params.pop("pos_embedding")
    scanned = [k for k in params if k.startswith("Transformer/encoderblock/")]
    if scanned:
        layout.append("scanned blocks")
        for key in scanned:
            stacked = params.pop(key)
            rest = key[len("Transformer/encoderblock/"):]
            for i, array in enumerate(stacked):
                params[f"Transformer/encoderblock_{i}/{rest}"] = array
    broadcast_gn = [k for k, v in params.items() if _GROUP_NORM.search(k) and v.ndim == 4]
    if broadcast_gn:  # the hybrids' older GroupNorm kept (1, 1, 1, C) scales and biases
        layout.append("(1, 1, 1, C) GroupNorm parameters")
        params.update({k: params[k].reshape(-1) for k in broadcast_gn})
    if any("/MultiHeadDotProductAttention_0/" in k for k in params):
        layout.append("Linen names")
        renamed = {}
        for key, value in params.items():
            parts = key.split("/")
            if _BLOCK.match(key):
                parts[2] = _LINEN_TO_PRE_LINEN.get(parts[2], parts[2])
            renamed["/".join(parts)] = value
        params = renamed
    return params, ", ".join(layout) or "vit_jax (pre-Linen names)", grid_only


def num_blocks(keys) -> int:
    indices = {int(m.group(1)) for k in keys if (m := _BLOCK.match(k))}
    return max(indices) + 1 if indices else 0


# ------------------------------------------------------------------- model side


def model_variables(model: keras.Model) -> dict[str, keras.Variable]:
    """The model's variables under their canonical checkpoint names."""
    named = {}
    for layer in model.layers:
        scope = checkpoint_name(layer.name)
        for variable in layer.weights:
            parts = variable.path.split("/")[1:] if "/" in variable.path else [variable.name]
            if len(parts) >= 2 and parts[-2].startswith("MultiHeadDotProductAttention"):
                parts[-1:] = parts[-1].rsplit("_", 1)  # query_kernel -> query/kernel
            parts[-1] = {"gamma": "scale", "beta": "bias"}.get(parts[-1], parts[-1])
            key = "cls" if isinstance(layer, ClassToken) else "/".join([scope, *parts])
            named[key] = variable
    return named


def _posemb_layer(model) -> AddPositionEmbedding | None:
    return next((la for la in model.layers if isinstance(la, AddPositionEmbedding)), None)


# ------------------------------------------------------------------- resampling


def resample_grid(grid: np.ndarray, new_grid: tuple[int, int], method: str = "zoom"):
    """Resizes a (h, w, D) grid of position embeddings to new_grid.

    "zoom": the official vit_jax algorithm, scipy.ndimage.zoom(order=1) (corner-aligned
    bilinear), here with separate factors for height and width. "bilinear": half-pixel
    bilinear without antialiasing, what timm does when it loads an .npz file.
    """
    old_h, old_w, _ = grid.shape
    factors = (new_grid[0] / old_h, new_grid[1] / old_w, 1)
    if method == "zoom":
        return scipy.ndimage.zoom(grid, factors, order=1)
    if method == "bilinear":
        for axis, (old, new) in enumerate(zip((old_h, old_w), new_grid, strict=True)):
            src = np.clip((np.arange(new) + 0.5) * old / new - 0.5, 0, old - 1)
            low = np.floor(src).astype(int)
            high = np.minimum(low + 1, old - 1)
            frac = (src - low).reshape([-1 if a == axis else 1 for a in range(3)])
            grid = (np.take(grid, low, axis=axis) * (1 - frac)
                    + np.take(grid, high, axis=axis) * frac)
        return grid
    raise ValueError(f"unknown resampling method {method!r}: expected 'zoom' or 'bilinear'")


def _source_grid(num_grid_tokens: int, target_grid: tuple[int, int]) -> tuple[int, int]:
    side = int(round(num_grid_tokens**0.5))
    if side * side == num_grid_tokens:
        return side, side
    if target_grid[0] * target_grid[1] == num_grid_tokens:
        return target_grid
    raise ValueError(f"position embedding of {num_grid_tokens} grid tokens is not a square "
                     "grid; cannot tell its height and width")


def adapt_posemb(posemb: np.ndarray, ckpt_prefix: int, layer: AddPositionEmbedding,
                 method: str) -> tuple[np.ndarray, str | None]:
    """Fits a checkpoint's (1, tokens, D) table to the model's grid and prefix tokens."""
    tokens, grid = posemb[0, :ckpt_prefix], posemb[0, ckpt_prefix:]
    old_grid = _source_grid(len(grid), layer.grid_size)
    note = None
    if old_grid != layer.grid_size:
        grid = resample_grid(grid.reshape(*old_grid, -1), layer.grid_size, method)
        grid = grid.reshape(-1, posemb.shape[-1])
        note = (f"grid {old_grid[0]}x{old_grid[1]} -> {layer.grid_size[0]}x"
                f"{layer.grid_size[1]} ({method})")
    if layer.num_prefix_tokens > ckpt_prefix:  # big_vision adds no embedding to the cls token
        tokens = np.zeros((layer.num_prefix_tokens, posemb.shape[-1]), posemb.dtype)
    tokens = tokens[:layer.num_prefix_tokens]
    return np.concatenate([tokens, grid])[None], note


# ------------------------------------------------------------------- loading


def load_params(model: keras.Model, params: dict[str, np.ndarray], source: str,
                layout: str, grid_only_posemb: bool = False,
                resample: str = "zoom") -> LoadReport:
    """Loads canonical (pre-Linen) arrays into the model; checks all before assigning any."""
    report = LoadReport(source=source, layout=layout)
    targets = model_variables(model)
    model_blocks, ckpt_blocks = num_blocks(targets), num_blocks(params)
    if model_blocks != ckpt_blocks:
        raise ValueError(f"{source}: checkpoint has {ckpt_blocks} encoder blocks, the model has "
                         f"{model_blocks}")
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
            ckpt_prefix = 0 if grid_only_posemb or "cls" not in params else 1
            value, note = adapt_posemb(value, ckpt_prefix, _posemb_layer(model), resample)
            if note:
                report.resampled[key] = note
        if tuple(value.shape) != expected:
            raise ValueError(f"{source}: shape mismatch for {key!r}: the model expects "
                             f"{expected}, the checkpoint has {tuple(value.shape)}")
        values[key] = value
    head_shapes = [tuple(targets[k].shape) for k in HEAD_KEYS if k in targets]
    if head_shapes:
        found = [tuple(params[k].shape) for k in HEAD_KEYS if k in params]
        if found == head_shapes:
            values.update({k: params[k].astype("float32") for k in HEAD_KEYS})
        else:
            values.update({k: np.zeros(targets[k].shape, "float32") for k in HEAD_KEYS})
            report.reinitialised = list(HEAD_KEYS)
            warnings.warn(f"{source}: head {found or 'absent'} does not fit the model's "
                          f"{head_shapes}; the head is zero-initialised (fine-tuning convention)",
                          stacklevel=3)
    for key, value in values.items():
        targets[key].assign(value)
    report.loaded = sorted(set(values) - set(report.reinitialised))
    used = set(values) - set(report.reinitialised)
    leftover = sorted(set(params) - used)
    report.dropped = [k for k in leftover if k.startswith(("pre_logits/", "head/")) or k == "cls"]
    report.unused = [k for k in leftover if k not in report.dropped]
    if report.unused:
        warnings.warn(f"{source}: unused keys {report.unused}", stacklevel=3)
    return report


def load_npz(model: keras.Model, path: str, resample: str = "auto") -> LoadReport:
    """Loads an official .npz checkpoint (vit_jax, AugReg, Linen, big_vision, scanned).

    resample: how to resize the position embedding to a new grid; "auto" is the official
    scipy zoom for vit_jax files and half-pixel bilinear for big_vision files (what each
    codebase does itself).
    """
    params, layout, grid_only = canonicalize(read_npz(path))
    if resample == "auto":
        resample = "bilinear" if grid_only else "zoom"
    return load_params(model, params, os.fspath(path), layout, grid_only, resample)


def model_params(model: keras.Model) -> dict[str, np.ndarray]:
    """The model's weights as canonical (pre-Linen) arrays."""
    return {key: keras.ops.convert_to_numpy(variable.value).astype("float32")
            for key, variable in model_variables(model).items()}


def save_npz(model: keras.Model, path: str, overwrite: bool = False) -> None:
    """Writes the weights in the official pre-Linen .npz layout (readable by vit_jax, timm)."""
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path!r} exists; pass overwrite=True to replace it")
    with open(path, "wb") as file:
        np.savez(file, **model_params(model))


TORCH_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def load_weights(model: keras.Model, weights: str) -> LoadReport | None:
    """Loads a local file into `model`, choosing the reader by its name: official .npz,
    .keras, .weights.h5, or timm / Hugging Face weights (.safetensors, .pth, .pt, .bin)."""
    path = os.fspath(weights)
    if not os.path.exists(path):
        raise FileNotFoundError(f"weights file {path!r} does not exist")
    if path.endswith(".weights.h5"):
        model.load_weights(path)
    elif path.endswith(".keras"):
        saved = keras.saving.load_model(path, compile=False, safe_mode=True)
        model.set_weights(saved.get_weights())
    elif path.endswith(".npz"):
        return load_npz(model, path)
    elif path.endswith(TORCH_SUFFIXES):
        from vit_keras.pytorch_weights import load_pytorch_weights

        return load_pytorch_weights(model, path)
    else:
        raise ValueError(f"weights {path!r}: expected a .npz, .keras, .weights.h5 or "
                         f"{', '.join(TORCH_SUFFIXES)} file")
    return None


def save_weights(model: keras.Model, path: str, overwrite: bool = False) -> None:
    """Writes .npz (official layout), .keras (whole model) or .weights.h5, never over a file
    that exists unless overwrite=True."""
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path!r} exists; pass overwrite=True to replace it")
    if path.endswith(".npz"):
        save_npz(model, path, overwrite=True)
    elif path.endswith(".keras"):
        model.save(path)
    elif path.endswith(".weights.h5"):
        model.save_weights(path)
    else:
        raise ValueError(f"cannot write {path!r}: expected a .npz, .keras or .weights.h5 name")
