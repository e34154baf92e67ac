"""An independent NumPy implementation of the paper's equations, for checking the library.

It reads weights by their checkpoint names and computes everything itself: patch
extraction by reshaping (not convolution), attention by explicit softmax, its own GELU
and LayerNorm. Nothing here calls vit_keras.
"""

import math

import numpy as np
from scipy.special import erf


def layer_norm(x, scale, bias, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def gelu(x, approximate=True):
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def patches(images, patch):
    """(B, H, W, C) -> (B, N, P*P*C), row-major over the grid, (row, col, channel) inside."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


def sincos2d(grid_h, grid_w, width, temperature=10_000.0):
    """MoCo v3 / big_vision: omega_i = 1 / T^(i / (D/4 - 1)); [sin x, cos x, sin y, cos y]."""
    quarter = width // 4
    omega = np.array([1.0 / temperature ** (i / (quarter - 1)) for i in range(quarter)])
    rows = []
    for y in range(grid_h):
        for x in range(grid_w):
            rows.append(np.concatenate([np.sin(x * omega), np.cos(x * omega),
                                        np.sin(y * omega), np.cos(y * omega)]))
    return np.array(rows)


def same_padding(size, kernel, stride):
    """TensorFlow / Flax SAME: output ceil(size / stride), the extra pixel padded at the end."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def conv_same(x, kernel, stride):
    """Cross-correlation with SAME padding, as a sum of shifted matmuls."""
    kh, kw, _, out = kernel.shape
    pads = [same_padding(x.shape[1], kh, stride), same_padding(x.shape[2], kw, stride)]
    x = np.pad(x, [(0, 0), *pads, (0, 0)])
    oh, ow = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
    y = np.zeros((x.shape[0], oh, ow, out))
    for i in range(kh):
        for j in range(kw):
            y += x[:, i:i + stride * oh:stride, j:j + stride * ow:stride] @ kernel[i, j]
    return y


def standardize_kernel(kernel, eps=1e-5):
    """BiT weight standardisation: per output filter, (w - mean) / (std + eps)."""
    kernel = kernel - kernel.mean(axis=(0, 1, 2))
    return kernel / (kernel.std(axis=(0, 1, 2)) + eps)


def group_norm(x, scale, bias, groups=32, eps=1e-6):
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = ((g - mean) ** 2).mean(axis=(1, 2, 4), keepdims=True)
    return ((g - mean) / np.sqrt(var + eps)).reshape(x.shape) * scale + bias


def max_pool_same(x, window=3, stride=2):
    pads = [same_padding(x.shape[1], window, stride), same_padding(x.shape[2], window, stride)]
    x = np.pad(x, [(0, 0), *pads, (0, 0)], constant_values=-np.inf)
    oh, ow = (x.shape[1] - window) // stride + 1, (x.shape[2] - window) // stride + 1
    return np.max([x[:, i:i + stride * oh:stride, j:j + stride * ow:stride]
                   for i in range(window) for j in range(window)], axis=0)


def relu(x):
    return np.maximum(x, 0)


def resnet(params, x, stage_units, width):
    """vit_jax's hybrid root and bottleneck stages (models_resnet.py), from checkpoint names."""
    def conv_gn(x, name, norm, stride=1):
        kernel = standardize_kernel(params[f"{name}/kernel"])
        return group_norm(conv_same(x, kernel, stride), params[f"{norm}/scale"],
                          params[f"{norm}/bias"])

    x = max_pool_same(relu(conv_gn(x, "conv_root", "gn_root", 2)))
    for s, units in enumerate(stage_units):
        features = width * 2**s
        for u in range(units):
            unit = f"block{s + 1}/unit{u + 1}/"
            stride = 2 if s > 0 and u == 0 else 1
            shortcut = x
            if x.shape[-1] != 4 * features or stride != 1:
                shortcut = conv_gn(x, unit + "conv_proj", unit + "gn_proj", stride)
            y = relu(conv_gn(x, unit + "conv1", unit + "gn1"))
            y = relu(conv_gn(y, unit + "conv2", unit + "gn2", stride))
            x = relu(shortcut + conv_gn(y, unit + "conv3", unit + "gn3"))
    return x


def relative_embedding(table, built, grid, dr, dc):
    """The embedding of displacement (dr, dc) between two patches of a grid (rows, cols),
    read from the 1-D table of offsets of a built (H, W) grid, where offset o = r W + c is
    row o + H W - 1: each axis's displacement scaled with the ends aligned (dr (H - 1) /
    (rows - 1); 0 on an axis of one patch), read bilinearly at its integer neighbours."""
    (rows, cols), (height, width) = grid, built
    scaled = [d * (b - 1) / (g - 1) if g > 1 else 0.0
              for d, b, g in ((dr, height, rows), (dc, width, cols))]
    neighbours = []
    for x in scaled:
        low = math.floor(x)
        neighbours.append([(low, 1 - (x - low)), (low + 1, x - low)])
    embedding = np.zeros(table.shape[1:])
    for r, row_weight in neighbours[0]:
        for c, col_weight in neighbours[1]:
            if row_weight * col_weight:
                embedding += row_weight * col_weight * table[r * width + c + height * width - 1]
    return embedding


def relative_bias(q, table, prefix_table, num_prefix, grids=None):
    """The paper's relative attention logits (Appendix D.4), pair by pair: q (B, heads, T, dh)
    dotted with the embedding of the pair's offset, over sqrt(dh). grids: (built, grid), the
    (rows, cols) the table is built for and those of the patches (both the square grid of the
    table by default); patches i, j read displacement (row_i - row_j, col_i - col_j)
    (relative_embedding); pairs with one of the num_prefix tokens before them use
    prefix_table[0] token->token, [1] token->patch, [2] patch->token."""
    b, heads, t, dh = q.shape
    if grids is None:
        side = math.isqrt((len(table) + 1) // 2)
        grids = ((side, side), (side, side))
    built, grid = grids
    assert grid[0] * grid[1] == t - num_prefix and len(table) == 2 * built[0] * built[1] - 1
    embeddings = np.zeros((t, t, heads, dh))
    for i in range(t):
        for j in range(t):
            if i < num_prefix:
                r = prefix_table[0] if j < num_prefix else prefix_table[1]
            elif j < num_prefix:
                r = prefix_table[2]
            else:
                (ri, ci), (rj, cj) = (divmod(k - num_prefix, grid[1]) for k in (i, j))
                r = relative_embedding(table, built, grid, ri - rj, ci - cj)
            embeddings[i, j] = r
    return np.einsum("bhid,ijhd->bhij", q, embeddings) / math.sqrt(dh)


def encoder_block(x, p, heads, approximate, relative_prefix=None, relative_grids=None):
    """relative_prefix: the tokens before the patches, for a posemb="relative" block;
    relative_grids: its (built, grid) (relative_bias)."""
    b, t, d = x.shape
    dh = d // heads
    y = layer_norm(x, p["LayerNorm_0/scale"], p["LayerNorm_0/bias"])
    att = "MultiHeadDotProductAttention_1/"
    q, k, v = (
        (y @ p[att + n + "/kernel"].reshape(d, d) + p[att + n + "/bias"].reshape(d))
        .reshape(b, t, heads, dh).transpose(0, 2, 1, 3)
        for n in ("query", "key", "value")
    )
    logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
    if relative_prefix is not None:
        logits = logits + relative_bias(q, p[att + "relative_embedding"],
                                        p.get(att + "prefix_relative_embedding"),
                                        relative_prefix, relative_grids)
    probs = softmax(logits)
    out = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + out @ p[att + "out/kernel"].reshape(d, d) + p[att + "out/bias"]
    y = layer_norm(x, p["LayerNorm_2/scale"], p["LayerNorm_2/bias"])
    h = gelu(y @ p["MlpBlock_3/Dense_0/kernel"] + p["MlpBlock_3/Dense_0/bias"], approximate)
    return x + h @ p["MlpBlock_3/Dense_1/kernel"] + p["MlpBlock_3/Dense_1/bias"], probs


def forward(params, images, *, patch, heads, layers, classifier="token", posemb=None,
            approximate=True, representation=False, return_attention=False, resnet_stages=None,
            resnet_width=64, return_blocks=False, relative_prefix=None, relative_built=None):
    """Logits of the paper's model; posemb is the (tokens, D) table to add, or None.
    resnet_stages (units per stage, () for the root alone) makes it a hybrid.
    return_blocks: also return every block's output tokens and the pooled representation.
    relative_prefix: a posemb="relative" model's tokens before the patches (encoder_block);
    relative_built: the (rows, cols) its tables are built for, when not the images' grid."""
    if resnet_stages is not None:
        images = resnet(params, images, resnet_stages, resnet_width)
    grid = (images.shape[1] // patch, images.shape[2] // patch)
    relative_grids = (relative_built or grid, grid)
    kernel = params["embedding/kernel"]
    x = patches(images, patch) @ kernel.reshape(-1, kernel.shape[-1]) + params["embedding/bias"]
    if classifier == "token":
        cls = np.broadcast_to(params["cls"], (x.shape[0], 1, x.shape[-1]))
        x = np.concatenate([cls, x], axis=1)
    if posemb is not None:
        x = x + posemb
    attention, blocks = [], []
    for i in range(layers):
        prefix = f"Transformer/encoderblock_{i}/"
        block = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
        x, probs = encoder_block(x, block, heads, approximate, relative_prefix, relative_grids)
        attention.append(probs)
        blocks.append(x)
    x = layer_norm(x, params["Transformer/encoder_norm/scale"],
                   params["Transformer/encoder_norm/bias"])
    x = x[:, 0] if classifier == "token" else x.mean(axis=1)
    if representation:
        x = np.tanh(x @ params["pre_logits/kernel"] + params["pre_logits/bias"])
    logits = x @ params["head/kernel"] + params["head/bias"]
    if return_blocks:
        return logits, blocks, x
    return (logits, attention) if return_attention else logits
