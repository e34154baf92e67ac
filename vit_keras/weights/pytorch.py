"""PyTorch ViT weights in: timm `vit_*` and Hugging Face `ViTModel` / `ViTForImageClassification`.

Both are rewritten into the canonical (pre-Linen .npz) names, transposing kernels, and then
loaded by vit_keras.weights.assign.load_params. Build the model with approximate_gelu=False
for them: they were trained (or converted to run) with the exact erf GELU.
"""

from __future__ import annotations

import os
import re

import keras
import numpy as np

from vit_keras.weights.assign import LoadReport, load_params, model_variables

TORCH_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """A .safetensors file, or a torch state-dict file read with weights_only=True."""
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        return load_file(path)
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state.get("model", state))
    return {k: v.float().numpy() for k, v in state.items() if hasattr(v, "numpy")}


def _heads_kernel(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """torch Linear weight (H*Dh, D) -> (D, H, Dh)."""
    return weight.T.reshape(weight.shape[1], num_heads, -1)


def _block(prefix, norm1, qkv, proj, norm2, fc1, fc2, num_heads):
    """One encoder block's canonical arrays; qkv is a list of three (weight, bias) pairs."""
    att = prefix + "MultiHeadDotProductAttention_1/"
    out = {prefix + "LayerNorm_0/scale": norm1[0], prefix + "LayerNorm_0/bias": norm1[1],
           prefix + "LayerNorm_2/scale": norm2[0], prefix + "LayerNorm_2/bias": norm2[1],
           att + "out/kernel": proj[0].T.reshape(num_heads, -1, proj[0].shape[0]),
           att + "out/bias": proj[1]}
    for i, (weight, bias) in enumerate((fc1, fc2)):
        out[f"{prefix}MlpBlock_3/Dense_{i}/kernel"] = weight.T
        out[f"{prefix}MlpBlock_3/Dense_{i}/bias"] = bias
    for name, (weight, bias) in zip(("query", "key", "value"), qkv, strict=True):
        out[att + name + "/kernel"] = _heads_kernel(weight, num_heads)
        out[att + name + "/bias"] = bias.reshape(num_heads, -1)
    return out


def _pair(state, name):
    return state[name + ".weight"], state[name + ".bias"]


def _common(cls, posemb, patch_weight, patch_bias, norm):
    params = {"embedding/kernel": patch_weight.transpose(2, 3, 1, 0), "embedding/bias": patch_bias,
              "Transformer/posembed_input/pos_embedding": posemb,
              "Transformer/encoder_norm/scale": norm[0], "Transformer/encoder_norm/bias": norm[1]}
    if cls is not None:
        params["cls"] = cls
    return params


def from_timm(state: dict[str, np.ndarray], num_heads: int) -> dict[str, np.ndarray]:
    if "fc_norm.weight" in state:
        raise ValueError("timm model with fc_norm (LayerNorm after pooling) is not the paper's "
                         "architecture; vit_keras normalises before pooling")
    params = _common(state.get("cls_token"), state["pos_embed"], *_pair(state, "patch_embed.proj"),
                     _pair(state, "norm"))
    depth = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    for i in range(depth):
        b = f"blocks.{i}."
        qkv_w, qkv_b = _pair(state, b + "attn.qkv")
        qkv = list(zip(np.split(qkv_w, 3), np.split(qkv_b, 3), strict=True))
        params.update(_block(f"Transformer/encoderblock_{i}/", _pair(state, b + "norm1"), qkv,
                             _pair(state, b + "attn.proj"), _pair(state, b + "norm2"),
                             _pair(state, b + "mlp.fc1"), _pair(state, b + "mlp.fc2"), num_heads))
    if "head.weight" in state:
        params["head/kernel"], params["head/bias"] = state["head.weight"].T, state["head.bias"]
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


def from_huggingface(state: dict[str, np.ndarray], num_heads: int) -> dict[str, np.ndarray]:
    prefix = "vit." if any(k.startswith("vit.") for k in state) else ""
    state = {_hub_name(k[len(prefix):] if k.startswith(prefix) else k): v
             for k, v in state.items()}
    params = _common(state.get("embeddings.cls_token"), state["embeddings.position_embeddings"],
                     *_pair(state, "embeddings.patch_embeddings.projection"),
                     _pair(state, "layernorm"))
    depth = len({k.split(".")[2] for k in state if k.startswith("encoder.layer.")})
    for i in range(depth):
        b = f"encoder.layer.{i}."
        qkv = [_pair(state, b + f"attention.attention.{n}") for n in ("query", "key", "value")]
        params.update(_block(f"Transformer/encoderblock_{i}/", _pair(state, b + "layernorm_before"),
                             qkv, _pair(state, b + "attention.output.dense"),
                             _pair(state, b + "layernorm_after"),
                             _pair(state, b + "intermediate.dense"),
                             _pair(state, b + "output.dense"), num_heads))
    if "pooler.dense.weight" in state:  # ViTModel's pooler is the paper's tanh pre_logits
        params["pre_logits/kernel"] = state["pooler.dense.weight"].T
        params["pre_logits/bias"] = state["pooler.dense.bias"]
    if "classifier.weight" in state:
        params["head/kernel"] = state["classifier.weight"].T
        params["head/bias"] = state["classifier.bias"]
    return params


def _num_heads(model: keras.Model) -> int:
    """From block 0's query kernel, (D, heads, D_h)."""
    query = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
    return model_variables(model)[query].shape[1]


def load_pytorch_weights(model: keras.Model, source) -> LoadReport:
    """Loads a timm or Hugging Face ViT state dict (a path or a dict of arrays) into `model`."""
    name = os.fspath(source) if isinstance(source, str | os.PathLike) else "state dict"
    state = read_state_dict(source) if isinstance(source, str | os.PathLike) else {
        k: np.asarray(v) for k, v in source.items()}
    heads = _num_heads(model)
    if "patch_embed.proj.weight" in state:
        params, layout = from_timm(state, heads), "timm state dict"
    elif any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in state):
        params, layout = from_huggingface(state, heads), "Hugging Face ViT state dict"
    else:
        raise ValueError(f"{name}: neither a timm ViT (patch_embed.proj.weight) nor a Hugging "
                         "Face ViT (embeddings.patch_embeddings.projection.weight) state dict")
    return load_params(model, params, name, layout, resample="bilinear")
