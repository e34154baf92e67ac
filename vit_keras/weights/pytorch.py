"""PyTorch ViT weights in: timm `vit_*` and Hugging Face `ViTModel` / `ViTForImageClassification`.

Both are rewritten into the canonical (pre-Linen .npz) names, transposing kernels, and then
loaded by vit_keras.weights.assign.load_params. Reading is strict: every key of the state dict
is used or reported, a key of a feature vit_keras does not load (a gated MLP, attention
pooling, ...) is refused by name, a part the model and the file do not share (LayerScale,
qk-norm, registers, ...) is refused naming the vk.vit() option, and a missing key is a
ValueError naming it. Build the model with approximate_gelu=False for these files: they were
trained (or converted to run) with the exact erf GELU.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable

import keras
import numpy as np

from vit_keras import configs
from vit_keras.weights.assign import (
    POSEMB_KEY,
    LoadReport,
    load_params,
    model_variables,
    num_embedded_prefix,
)

TORCH_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")

# Keys of features vit_keras' model does not have, by layout: (pattern, what the feature is).
TIMM_UNREPRESENTABLE = (
    (r"blocks\.\d+\.(attn|mlp)\.norm\.", "a LayerNorm inside attention or the MLP "
                                         "(timm scale_attn_norm / scale_mlp_norm)"),
    (r"blocks\.\d+\.mlp\.(fc1_[gx]|w12|w3)\.", "a gated (SwiGLU) MLP"),
    (r"^attn_pool\.", "attention pooling (timm global_pool='map')"),
)
HUGGINGFACE_UNREPRESENTABLE = (
    (r"mlp\.weights_(in|out)\.", "a gated (SwiGLU) MLP"),
)
HUGGINGFACE_DINOV2_UNREPRESENTABLE = (
    *TIMM_UNREPRESENTABLE,
    (r"^classifier\.", "Hugging Face's DINOv2 classifier (on the class token and the mean "
                       "patch token side by side)"),
)
# Keys that change nothing the model computes: listed in the report's unused keys.
HARMLESS = (r"num_batches_tracked$", r"(^|\.)mask_token$")
# Keys that are absent when the checkpoint was trained without a part the model has.
MISSING_MEANS = (
    (r"^norm\.(weight|bias)$", "no LayerNorm after the encoder (timm final_norm=False)"),
)


@dataclasses.dataclass
class StateDict:
    """A state dict read key by key, remembering which keys were used."""

    arrays: dict[str, np.ndarray]
    source: str
    layout: str
    used: set[str] = dataclasses.field(default_factory=set)

    def __contains__(self, key: str) -> bool:
        return key in self.arrays

    def take(self, key: str) -> np.ndarray:
        if key not in self.arrays:
            raise ValueError(f"{self.source}: key {key!r} is missing from the {self.layout}"
                             f"{self._missing_hint(key)}")
        self.used.add(key)
        return self.arrays[key]

    def pair(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return self.take(name + ".weight"), self.take(name + ".bias")

    def weight_and_bias(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """A Linear layer's weight and its bias, None where it has none (timm proj_bias)."""
        return self.take(name + ".weight"), self.optional(name + ".bias")

    def optional(self, key: str) -> np.ndarray | None:
        return self.take(key) if key in self.arrays else None

    def leftover(self) -> list[str]:
        return sorted(set(self.arrays) - self.used)

    def _missing_hint(self, key: str) -> str:
        hint = ""
        weight = key[:-len("bias")] + "weight" if key.endswith(".bias") else None
        if weight in self.arrays:
            hint = f" (expected shape ({self.arrays[weight].shape[0]},))"
        meaning = next((text for pattern, text in MISSING_MEANS if re.search(pattern, key)), None)
        if meaning:
            hint += f"; a checkpoint with {meaning} is not the paper's model"
        return hint


def read_state_dict(path: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """A .safetensors file, or a torch state-dict file read with weights_only=True: its
    arrays, and the names of what else the file holds (a training checkpoint's optimizer
    state, epoch, ... beside its "model" or "state_dict"), for the load report."""
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        return load_file(path), []
    import torch

    saved = torch.load(path, map_location="cpu", weights_only=True)
    wrapper = next((key for key in ("state_dict", "model") if key in saved), None)
    state = saved[wrapper] if wrapper else saved
    others = [f"{key} (beside {wrapper!r})" for key in saved if wrapper and key != wrapper]
    others += [key for key, value in state.items() if not hasattr(value, "numpy")]
    return {k: v.float().numpy() for k, v in state.items() if hasattr(v, "numpy")}, others


def refuse_unrepresentable(state: StateDict, features) -> None:
    """A ValueError naming the first key of a feature vit_keras' model does not have."""
    for key in state.arrays:
        for pattern, feature in features:
            if re.search(pattern, key):
                raise ValueError(f"{state.source}: key {key!r} belongs to {feature}, which "
                                 "vit_keras does not load; refusing to load a different "
                                 "model")


def _heads_kernel(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """torch Linear weight (H*Dh, D) -> (D, H, Dh)."""
    return weight.T.reshape(weight.shape[1], num_heads, -1)


def _block(prefix, norm1, qkv, proj, norm2, fc1, fc2, num_heads):
    """One encoder block's canonical arrays; qkv is a list of three (weight, bias), proj, fc1
    and fc2 are (weight, bias); a bias may be None (timm's qkv_bias, proj_bias)."""
    att = prefix + "MultiHeadDotProductAttention_1/"
    out = {prefix + "LayerNorm_0/scale": norm1[0], prefix + "LayerNorm_0/bias": norm1[1],
           prefix + "LayerNorm_2/scale": norm2[0], prefix + "LayerNorm_2/bias": norm2[1],
           att + "out/kernel": proj[0].T.reshape(num_heads, -1, proj[0].shape[0])}
    biases = {att + "out/bias": proj[1]}
    for i, (weight, bias) in enumerate((fc1, fc2)):
        out[f"{prefix}MlpBlock_3/Dense_{i}/kernel"] = weight.T
        biases[f"{prefix}MlpBlock_3/Dense_{i}/bias"] = bias
    out.update({k: v for k, v in biases.items() if v is not None})
    for name, (weight, bias) in zip(("query", "key", "value"), qkv, strict=True):
        out[att + name + "/kernel"] = _heads_kernel(weight, num_heads)
        if bias is not None:
            out[att + name + "/bias"] = bias.reshape(num_heads, -1)
    return out


def _common(cls, posemb, patch_weight, patch_bias, norm):
    """The arrays every layout has; cls and patch_bias may be None (no class token; CLIP's
    bias-free patch embedding), norm too (fc_norm models: the norm is after pooling)."""
    params = {"embedding/kernel": patch_weight.transpose(2, 3, 1, 0), POSEMB_KEY: posemb}
    optional = {"cls": cls, "embedding/bias": patch_bias}
    if norm is not None:
        optional.update({"Transformer/encoder_norm/scale": norm[0],
                         "Transformer/encoder_norm/bias": norm[1]})
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


def _norm(params: dict, state: StateDict, key: str, canonical: str) -> None:
    """A LayerNorm `key` (weight, bias) of the state dict, if present, as `canonical`."""
    if key + ".weight" in state:
        params[canonical + "/scale"], params[canonical + "/bias"] = state.pair(key)


def _dense(params: dict, state: StateDict, key: str, canonical: str) -> None:
    """A Linear layer `key` of the state dict, if present, as a Dense `canonical` (kernel
    transposed)."""
    if key + ".weight" in state:
        weight, bias = state.pair(key)
        params[canonical + "/kernel"], params[canonical + "/bias"] = weight.T, bias


def _timm_prefix_tokens(state: StateDict, params: dict) -> None:
    """Register tokens (timm's reg_token, DINOv2's register_tokens) and DeiT's distillation
    token. Where the position embedding also covers the registers (timm no_embed_class=False),
    their rows are constants added to the tokens, folded into them here."""
    registers = state.optional("reg_token")
    if registers is None:
        registers = state.optional("register_tokens")
    if "dist_token" in state:
        params["dist_token/tokens"] = state.take("dist_token")
    if registers is None:
        return
    posemb, count = params[POSEMB_KEY], registers.shape[1]
    first = num_embedded_prefix(params)
    patches = posemb.shape[1] - first - count
    if patches > 0 and int(round(patches**0.5)) ** 2 == patches:
        registers = registers + posemb[:, first:first + count]
        params[POSEMB_KEY] = np.concatenate([posemb[:, :first], posemb[:, first + count:]], 1)
    params["registers/tokens"] = registers


def _depth(state: StateDict, prefix: str) -> int:
    """The number of blocks, numbered after `prefix` ("blocks." -> blocks.0., blocks.1., ...)."""
    block = re.compile(re.escape(prefix) + r"(\d+)\.")
    return len({m.group(1) for k in state.arrays if (m := block.match(k))})


def from_timm(state: StateDict, num_heads: int) -> dict[str, np.ndarray]:
    norm = state.pair("norm") if "norm.weight" in state or "fc_norm.weight" not in state else None
    params = _common(state.optional("cls_token"), state.take("pos_embed"),
                     state.take("patch_embed.proj.weight"),
                     state.optional("patch_embed.proj.bias"), norm)
    _timm_prefix_tokens(state, params)
    _norm(params, state, "norm_pre", "Transformer/pre_norm")
    _norm(params, state, "fc_norm", "fc_norm")
    for i in range(_depth(state, "blocks.")):
        b, canonical = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        qkv_bias = state.optional(b + "attn.qkv.bias")  # absent: timm's qkv_bias=False
        qkv = list(zip(np.split(state.take(b + "attn.qkv.weight"), 3),
                       [None] * 3 if qkv_bias is None else np.split(qkv_bias, 3), strict=True))
        params.update(_block(canonical, state.pair(b + "norm1"), qkv,
                             state.weight_and_bias(b + "attn.proj"), state.pair(b + "norm2"),
                             state.weight_and_bias(b + "mlp.fc1"),
                             state.weight_and_bias(b + "mlp.fc2"), num_heads))
        for j in range(2):  # LayerScale (timm's init_values)
            if f"{b}ls{j + 1}.gamma" in state:
                params[f"{canonical}LayerScale_{j}/scale"] = state.take(f"{b}ls{j + 1}.gamma")
        attention = canonical + "MultiHeadDotProductAttention_1/"
        _norm(params, state, b + "attn.q_norm", attention + "query_norm")
        _norm(params, state, b + "attn.k_norm", attention + "key_norm")
    _dense(params, state, "head", "head")
    _dense(params, state, "head_dist", "head_dist")
    return params


# transformers 5 names its in-memory modules differently from the files on the hub.
_HF_V5_TO_HUB = {"attention.q_proj.": "attention.attention.query.",
                 "attention.k_proj.": "attention.attention.key.",
                 "attention.v_proj.": "attention.attention.value.",
                 "attention.o_proj.": "attention.output.dense.",
                 "mlp.fc1.": "intermediate.dense.", "mlp.fc2.": "output.dense."}


def _hub_name(key: str) -> str:
    match = re.match(r"^layers\.(\d+)\.(.+)$", key)
    if not match:
        return key
    index, rest = match.groups()
    for new, old in _HF_V5_TO_HUB.items():
        if rest.startswith(new):
            rest = old + rest[len(new):]
    return f"encoder.layer.{index}.{rest}"


def from_huggingface(state: StateDict, num_heads: int) -> dict[str, np.ndarray]:
    params = _common(state.optional("embeddings.cls_token"),
                     state.take("embeddings.position_embeddings"),
                     *state.pair("embeddings.patch_embeddings.projection"),
                     state.pair("layernorm"))
    for i in range(_depth(state, "encoder.layer.")):
        b = f"encoder.layer.{i}."
        qkv = [(state.take(f"{b}attention.attention.{n}.weight"),
                state.optional(f"{b}attention.attention.{n}.bias"))  # absent: qkv_bias=False
               for n in ("query", "key", "value")]
        params.update(_block(f"Transformer/encoderblock_{i}/", state.pair(b + "layernorm_before"),
                             qkv, state.pair(b + "attention.output.dense"),
                             state.pair(b + "layernorm_after"),
                             state.pair(b + "intermediate.dense"),
                             state.pair(b + "output.dense"), num_heads))
    if "embeddings.distillation_token" in state:  # DeiT
        params["dist_token/tokens"] = state.take("embeddings.distillation_token")
    _dense(params, state, "pooler.dense", "pre_logits")  # ViTModel's pooler: the tanh pre_logits
    # ViTForImageClassification's head; DeiT's two (the class and distillation tokens')
    _dense(params, state, "classifier", "head")
    _dense(params, state, "cls_classifier", "head")
    _dense(params, state, "distillation_classifier", "head_dist")
    return params


def _huggingface_names(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hub names without the task model's `vit.` or `deit.` prefix."""
    prefix = next((p for p in ("vit.", "deit.") if any(k.startswith(p) for k in arrays)), "")
    return {_hub_name(k.removeprefix(prefix)): v for k, v in arrays.items()}


# Hugging Face's DINOv2 names (the hub's and transformers 5's) -> timm's, block by block.
_HF_DINOV2_BLOCK = (("attention.attention.query.", "q."), ("attention.attention.key.", "k."),
                    ("attention.attention.value.", "v."), ("attention.q_proj.", "q."),
                    ("attention.k_proj.", "k."), ("attention.v_proj.", "v."),
                    ("attention.output.dense.", "attn.proj."), ("attention.o_proj.", "attn.proj."),
                    ("layer_scale1.lambda1", "ls1.gamma"), ("layer_scale2.lambda1", "ls2.gamma"))
_HF_DINOV2_OUTSIDE = {"embeddings.cls_token": "cls_token", "embeddings.mask_token": "mask_token",
                      "embeddings.position_embeddings": "pos_embed",
                      "embeddings.register_tokens": "register_tokens",
                      "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
                      "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
                      "layernorm.weight": "norm.weight", "layernorm.bias": "norm.bias"}


def _dinov2_to_timm_names(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hugging Face's Dinov2Model / Dinov2WithRegistersModel as the original DINOv2 (timm)
    layout: its separate query, key and value joined into timm's qkv."""
    out, qkv = {}, {}
    for key, value in arrays.items():
        key = key.removeprefix("dinov2.")
        match = re.match(r"^encoder\.layer\.(\d+)\.(.+)$", key)
        if not match:
            out[_HF_DINOV2_OUTSIDE.get(key, key)] = value
            continue
        index, rest = match.groups()
        for hf, timm in _HF_DINOV2_BLOCK:
            if rest.startswith(hf):
                rest = timm + rest[len(hf):]
        if rest[:2] in ("q.", "k.", "v."):
            qkv.setdefault((index, rest[2:]), {})[rest[0]] = value
        else:
            out[f"blocks.{index}.{rest}"] = value
    for (index, part), arrays_qkv in qkv.items():
        out[f"blocks.{index}.attn.qkv.{part}"] = np.concatenate(
            [arrays_qkv[name] for name in "qkv"])
    return out


@dataclasses.dataclass(frozen=True)
class Layout:
    """A PyTorch state-dict layout: the key that marks it, its converter to canonical
    arrays, the keys of features vit_keras cannot represent, and a renaming done first."""

    name: str
    marker: str
    convert: Callable[[StateDict, int], dict[str, np.ndarray]]
    unrepresentable: tuple[tuple[str, str], ...]
    rename: Callable[[dict], dict] = dict


LAYOUTS = (
    Layout("timm state dict", "patch_embed.proj.weight", from_timm, TIMM_UNREPRESENTABLE),
    Layout("Hugging Face DINOv2 state dict", ".layer_scale1.lambda1", from_timm,
           HUGGINGFACE_DINOV2_UNREPRESENTABLE, _dinov2_to_timm_names),
    Layout("Hugging Face ViT state dict", "embeddings.patch_embeddings.projection.weight",
           from_huggingface, HUGGINGFACE_UNREPRESENTABLE, _huggingface_names),
)


QUERY_KERNEL = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"


def _posemb_is_grid_only(posemb: np.ndarray, has_cls: bool, model: keras.Model) -> bool:
    """timm's no_embed_class (DeiT III and others): a class token, but a position embedding
    of the patch grid only. A square grid tells them apart; else the model's own grid does."""
    rows = posemb.shape[1]
    grid = model.get_layer(configs.POSITION_EMBEDDING).grid_size

    def is_grid(n):
        return n == grid[0] * grid[1] or int(round(n**0.5)) ** 2 == n

    return has_cls and is_grid(rows) and not is_grid(rows - 1)


def load_pytorch_weights(model: keras.Model, source) -> LoadReport:
    """Loads a timm or Hugging Face ViT state dict into a model. Reading is strict: every key
    is used or reported, a feature vit_keras does not build is refused by name, and a part
    the model and the file do not share is refused naming the vk.vit option. These weights
    were trained (or converted to run) with the exact erf GELU: build the model with
    approximate_gelu=False.

    Args:
        model: a vk.vit model built with the checkpoint's options.
        source: a .safetensors file, a torch state-dict file (.pth, .pt, .bin; read with
            weights_only=True), or a dict of arrays (a state dict in memory).

    Returns:
        The LoadReport of what was loaded.

    Raises:
        ValueError: neither a timm nor a Hugging Face ViT, DeiT or DINOv2 state dict, keys of
            a model vit_keras does not build, or a checkpoint that does not fit the model.
    """
    name = os.fspath(source) if isinstance(source, str | os.PathLike) else "state dict"
    arrays, others = (read_state_dict(source) if isinstance(source, str | os.PathLike)
                      else ({k: np.asarray(v) for k, v in source.items()}, []))
    layout = next((layout for layout in LAYOUTS
                   if any(k.endswith(layout.marker) for k in arrays)), None)
    if layout is None:
        raise ValueError(f"{name}: neither a timm ViT (patch_embed.proj.weight) nor a Hugging "
                         "Face ViT, DeiT or DINOv2 (embeddings.patch_embeddings.projection."
                         "weight) state dict")
    state = StateDict(layout.rename(arrays), name, layout.name)
    refuse_unrepresentable(state, layout.unrepresentable)
    targets = model_variables(model)
    params = layout.convert(state, targets[QUERY_KERNEL].shape[1])  # (D, heads, D_h)
    harmless = [k for k in state.leftover() if any(re.search(p, k) for p in HARMLESS)]
    unknown = sorted(set(state.leftover()) - set(harmless))
    if unknown:
        raise ValueError(f"{name}: keys {unknown} of the {state.layout} are not part of any "
                         "model vit_keras builds; refusing to load a different model")
    if "cls" in params and "cls" not in targets:
        raise ValueError(f"{name}: the {state.layout} has a class token, which the model "
                         "(classifier='gap') has not: build it with classifier='token'")
    grid_only = _posemb_is_grid_only(params[POSEMB_KEY], "cls" in params, model)
    report = load_params(model, params, name, state.layout, grid_only_posemb=grid_only,
                         resample="bilinear")
    report.unused += harmless + others
    return report
