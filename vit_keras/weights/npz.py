"""Official .npz checkpoints in and out: vit_jax, AugReg, Linen, big_vision and scanned
layouts, each rewritten to the canonical pre-Linen names (vit_keras.weights.assign)."""

from __future__ import annotations

import math
import os
import re
import zipfile
from typing import NamedTuple

import keras
import numpy as np

from vit_keras.configs import ViTConfig
from vit_keras.weights.assign import (
    AXIS_POSEMB_KEYS,
    BLOCK_KEY,
    POSEMB_KEY,
    RELATIVE_KEY,
    LoadReport,
    load_params,
    merged_kernels,
    model_variables,
    num_blocks,
    num_embedded_prefix,
)

_PREFIXES = ("opt/target/", "params/img/", "params/")
# Linen / big_vision sub-module names -> the pre-Linen names of the vit_jax files.
_LINEN_TO_PRE_LINEN = {"MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
                       "LayerNorm_1": "LayerNorm_2", "MlpBlock_0": "MlpBlock_3"}
_GROUP_NORM = re.compile(r"(^|/)gn(\d+|_root|_proj)/(scale|bias)$")
_RESNET_UNIT = re.compile(r"^block(\d+)/unit(\d+)/")


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
            if BLOCK_KEY.match(key):
                parts[2] = _LINEN_TO_PRE_LINEN.get(parts[2], parts[2])
            renamed["/".join(parts)] = value
        params = renamed
    return params, ", ".join(layout) or "vit_jax (pre-Linen names)", grid_only


class NpzModel(NamedTuple):
    """What an .npz checkpoint's arrays say of its model."""

    config: ViTConfig  # the shape, a hybrid's ResNet too
    image_size: int | None  # None unless a learned position embedding covers a square grid
    num_classes: int | None  # None without a head
    classifier: str  # "token" with a class token, else "gap"
    posemb: str | None  # the learned kind it holds; None: fixed or none, which no array shows


def _posemb_kind(params: dict[str, np.ndarray]) -> str | None:
    if POSEMB_KEY in params:
        return "learned"
    if any(key in params for key in AXIS_POSEMB_KEYS):
        return "learned2d"
    if any(RELATIVE_KEY.search(key) for key in params):
        return "relative"
    return None


def read_npz_shape(path: str) -> NpzModel:
    """The model an .npz checkpoint holds, read from its arrays' names and shapes."""
    params, _, grid_only = canonicalize(read_npz(path))
    first = "Transformer/encoderblock_0/"
    needed = ("embedding/kernel", first + "MultiHeadDotProductAttention_1/query/kernel",
              first + "MlpBlock_3/Dense_0/kernel")
    missing = [key for key in needed if key not in params]
    if missing:
        raise ValueError(f"{os.fspath(path)!r} has no {', '.join(missing)}: not a ViT "
                         "checkpoint in a layout whose shapes give the model")
    patch, _, _, hidden = params[needed[0]].shape
    units = {}
    for key in params:
        if match := _RESNET_UNIT.match(key):
            stage, unit = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    hybrid = "conv_root/kernel" in params
    config = ViTConfig(
        hidden_size=int(hidden), num_layers=num_blocks(params),
        num_heads=int(params[needed[1]].shape[1]), mlp_dim=int(params[needed[2]].shape[1]),
        patch_size=int(patch), resnet_layers=tuple(units[s] for s in sorted(units)) if hybrid
        else None, resnet_width=int(params["conv_root/kernel"].shape[-1]) if hybrid else 64)
    image_size = None
    if POSEMB_KEY in params:
        tokens = params[POSEMB_KEY].shape[1] - (0 if grid_only else num_embedded_prefix(params))
        side = math.isqrt(tokens)
        image_size = side * config.cell_size if side * side == tokens else None
    head = params.get("head/kernel")
    return NpzModel(config, image_size, None if head is None else int(head.shape[-1]),
                    "token" if "cls" in params else "gap", _posemb_kind(params))


def load_npz(model: keras.Model, path: str, resample: str = "auto") -> LoadReport:
    """Loads an official .npz checkpoint into a model: the vit_jax, AugReg, Linen, big_vision
    and scanned layouts, each rewritten to the canonical pre-Linen names first. The whole
    file is checked before anything is assigned, so a checkpoint that does not fit changes
    nothing.

    Args:
        model: a vk.vit model built with the checkpoint's options.
        path: the .npz file.
        resample: how the position embedding is fitted to another grid: "zoom" (scipy's
            spline zoom, as vit_jax does), "bilinear" (half-pixel bilinear, as big_vision
            does), or "auto", each file's own codebase's way.

    Returns:
        The LoadReport of what was loaded, resampled or left out.

    Raises:
        ValueError: a checkpoint that does not fit the model (another depth, a missing key,
            a shape or option that differs, named in the message).
    """
    params, layout, grid_only = canonicalize(read_npz(path))
    if resample == "auto":
        resample = "bilinear" if grid_only else "zoom"
    return load_params(model, params, os.fspath(path), layout, grid_only, resample)


def model_params(model: keras.Model) -> dict[str, np.ndarray]:
    """The model's weights as canonical (pre-Linen) arrays, LoRA adapters merged in."""
    merged = merged_kernels(model)
    return {key: keras.ops.convert_to_numpy(merged.get(variable.path, variable.value))
            .astype("float32") for key, variable in model_variables(model).items()}


def save_npz(model: keras.Model, path: str, overwrite: bool = False) -> None:
    """Writes a model's weights in the official pre-Linen .npz layout, which vit_jax and timm
    read; LoRA adapters are merged into their kernels.

    Args:
        model: a vk.vit model.
        path: the .npz file to write.
        overwrite: replace a file that exists.

    Raises:
        FileExistsError: path exists and overwrite is False.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path!r} exists; pass overwrite=True to replace it")
    with open(path, "wb") as file:
        np.savez(file, **model_params(model))
