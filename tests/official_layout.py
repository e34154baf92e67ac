"""Writes random checkpoints in the official layouts, from the facts file's description.

Test-side and independent of vit_keras: the names and shapes below are the spec.
"""

import numpy as np


def resnet_arrays(r, stages, width):
    """A hybrid's ResNet (vit_jax models_resnet.py): root, then units with a projection where
    the channels or the stride change. Returns the arrays and the feature map's channels."""
    p = {"conv_root/kernel": r(7, 7, 3, width), "gn_root/scale": 1 + r(width),
         "gn_root/bias": r(width)}
    channels = width
    for s, units in enumerate(stages):
        f = width * 2**s
        for u in range(units):
            unit = f"block{s + 1}/unit{u + 1}/"
            shapes = {"conv1": (1, 1, channels, f), "conv2": (3, 3, f, f),
                      "conv3": (1, 1, f, 4 * f)}
            if u == 0:  # channels change in every stage's first unit (stride too after the 1st)
                shapes["conv_proj"] = (1, 1, channels, 4 * f)
            for conv, shape in shapes.items():
                norm = conv.replace("conv", "gn")
                p[unit + conv + "/kernel"] = r(*shape)
                p[unit + norm + "/scale"], p[unit + norm + "/bias"] = 1 + r(shape[-1]), r(shape[-1])
            channels = 4 * f
    return p, channels


def random_checkpoint(rng, *, hidden=32, layers=2, heads=4, mlp=64, patch=8, grid=(4, 4),
                      classes=7, cls=True, representation=None, scale=0.2, resnet=None,
                      resnet_width=32):
    """Pre-Linen (vit_jax / AugReg) names, one array per key; resnet (units per stage) adds
    a hybrid's ResNet."""
    d, dh = hidden, hidden // heads

    def r(*shape):
        return rng.normal(0, scale, shape).astype("float32")

    p, channels = resnet_arrays(r, resnet, resnet_width) if resnet is not None else ({}, 3)
    tokens = grid[0] * grid[1] + (1 if cls else 0)
    p |= {"embedding/kernel": r(patch, patch, channels, d), "embedding/bias": r(d),
         "Transformer/posembed_input/pos_embedding": r(1, tokens, d),
         "Transformer/encoder_norm/scale": 1 + r(d), "Transformer/encoder_norm/bias": r(d),
         "head/kernel": r(representation or d, classes), "head/bias": r(classes)}
    if cls:
        p["cls"] = r(1, 1, d)
    if representation:
        p["pre_logits/kernel"], p["pre_logits/bias"] = r(d, representation), r(representation)
    for i in range(layers):
        b = f"Transformer/encoderblock_{i}/"
        a = b + "MultiHeadDotProductAttention_1/"
        p.update({b + "LayerNorm_0/scale": 1 + r(d), b + "LayerNorm_0/bias": r(d),
                  b + "LayerNorm_2/scale": 1 + r(d), b + "LayerNorm_2/bias": r(d),
                  a + "out/kernel": r(heads, dh, d), a + "out/bias": r(d),
                  b + "MlpBlock_3/Dense_0/kernel": r(d, mlp), b + "MlpBlock_3/Dense_0/bias": r(mlp),
                  b + "MlpBlock_3/Dense_1/kernel": r(mlp, d), b + "MlpBlock_3/Dense_1/bias": r(d)})
        for n in ("query", "key", "value"):
            p[a + n + "/kernel"], p[a + n + "/bias"] = r(d, heads, dh), r(heads, dh)
    return p


LINEN = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
         "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}


def to_linen(p):
    out = {}
    for k, v in p.items():
        for old, new in LINEN.items():
            k = k.replace(f"/{old}/", f"/{new}/")
        out[k] = v
    return out


def to_scanned(p, layers):
    """Block index as a leading axis under Transformer/encoderblock/ (Linen names)."""
    p = to_linen(p)
    out = {k: v for k, v in p.items() if "encoderblock_" not in k}
    for k in [k for k in p if k.startswith("Transformer/encoderblock_0/")]:
        rest = k[len("Transformer/encoderblock_0/"):]
        out["Transformer/encoderblock/" + rest] = np.stack(
            [p[f"Transformer/encoderblock_{i}/{rest}"] for i in range(layers)])
    return out


def to_big_vision(p):
    """params/ prefix, Linen names, position embedding of the grid only at the top level."""
    p = to_linen(p)
    posemb = p.pop("Transformer/posembed_input/pos_embedding")
    if "cls" in p:
        posemb = posemb[:, 1:]
    p["pos_embedding"] = posemb
    return {"params/" + k: v for k, v in p.items()}


def to_broadcast_group_norm(p):
    """The hybrids' older files: GroupNorm scale and bias stored as (1, 1, 1, C)."""
    return {k: v.reshape(1, 1, 1, -1) if "/gn" in "/" + k and k.endswith(("/scale", "/bias"))
            else v for k, v in p.items()}
