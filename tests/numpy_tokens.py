"""A ViT forward pass that merges tokens (ToMe; Bolya et al., ICLR 2023) or prunes them (EViT;
Liang et al., ICLR 2022), in NumPy, written from the papers' rules, for checking
vit_keras.tokens.

It reads weights by their checkpoint names (as tests/numpy_vit.py does, whose LayerNorm, GELU,
softmax and patch extraction it reuses) and decides every merge and every pruning one image at
a time, by plain loops over the tokens and sorting, not by the library's vectorised gathers.
Nothing here calls vit_keras.

The rules (ToMe and EViT as they act on a block's tokens, after the attention residual and
before the MLP):

- ToMe: p prefix tokens (class, distillation, registers) lead the sequence. r is capped at
  (t - p) // 2. A are the tokens at even positions, B those at odd ones; each A token that is
  not a prefix token finds its most similar B token that is not one, by the cosine similarity
  of the keys averaged over heads; the r A tokens with the highest similarity are merged into
  theirs by a size-weighted average, and sizes add up. The new order is the prefix tokens,
  then the unmerged A tokens, then the B tokens, each in their order. Every block adds
  log(size) of each key to the attention logits (proportional attention).
- EViT: n = t - p; keep = ceil(keep_rate * n) of the non-prefix tokens stay, those the class
  token attends to most (averaged over heads), in descending order of that attention; the rest
  are fused into one token weighted by it (not renormalised), appended last.
"""

import math

import numpy as np

from tests.numpy_vit import gelu, layer_norm, patches, softmax

ATTENTION = "MultiHeadDotProductAttention_1/"


def embed(params, images, patch, class_token, distilled, num_register_tokens):
    """Patch embedding, [class] [distillation] + position embedding, then the registers
    (which take no position embedding) after them."""
    kernel = params["embedding/kernel"]
    x = patches(images, patch) @ kernel.reshape(-1, kernel.shape[-1]) + params["embedding/bias"]
    front = []
    if class_token:
        front.append(params["cls"].reshape(1, -1))
    if distilled:
        front.append(params["dist_token/tokens"].reshape(1, -1))
    if front:
        front = np.broadcast_to(np.concatenate(front), (x.shape[0], len(front), x.shape[-1]))
        x = np.concatenate([front, x], axis=1)
    x = x + params["Transformer/posembed_input/pos_embedding"][0]
    if num_register_tokens:
        registers = np.broadcast_to(params["registers/tokens"].reshape(num_register_tokens, -1),
                                    (x.shape[0], num_register_tokens, x.shape[-1]))
        embedded = int(class_token) + int(distilled)
        x = np.concatenate([x[:, :embedded], registers, x[:, embedded:]], axis=1)
    return x


def attention(y, p, heads, sizes=None):
    """Multi-head self-attention of normed tokens y (B, t, D); sizes (B, t) add log(size) of
    each key to the logits. Returns the output (B, t, D), the probabilities (B, heads, t, t)
    and the keys (B, t, heads, D_h)."""
    dh = y.shape[-1] // heads

    def project(name):
        return (np.einsum("btd,dhk->bthk", y, p[ATTENTION + name + "/kernel"])
                + p[ATTENTION + name + "/bias"])

    q, k, v = project("query"), project("key"), project("value")
    logits = np.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(dh)
    if sizes is not None:
        logits = logits + np.log(sizes)[:, None, None, :]
    probs = softmax(logits)
    out = np.einsum("bhqs,bshk->bqhk", probs, v)
    out = np.einsum("bqhk,hkd->bqd", out, p[ATTENTION + "out/kernel"]) + p[ATTENTION + "out/bias"]
    return out, probs, k


def mlp(x, p, approximate):
    y = layer_norm(x, p["LayerNorm_2/scale"], p["LayerNorm_2/bias"])
    h = gelu(y @ p["MlpBlock_3/Dense_0/kernel"] + p["MlpBlock_3/Dense_0/bias"], approximate)
    return x + h @ p["MlpBlock_3/Dense_1/kernel"] + p["MlpBlock_3/Dense_1/bias"]


def merge_image(x, sizes, metric, r, num_prefix):
    """ToMe's bipartite soft matching on one image's tokens x (t, D) with sizes (t,) and
    metric (t, D_h). Returns the merged tokens, their sizes, the smallest gap between two
    scores whose order decided a merge (a float32 run agrees when it is clear of rounding) and
    inf (the new order follows positions, not scores)."""
    t = len(x)
    r = min(r, (t - num_prefix) // 2)
    if r <= 0:
        return x, sizes, math.inf, math.inf
    unit = metric / np.linalg.norm(metric, axis=-1, keepdims=True)
    sources = [i for i in range(0, t, 2) if i >= num_prefix]
    targets = [j for j in range(1, t, 2) if j >= num_prefix]
    best, best_score, margins = {}, {}, []
    for i in sources:
        scores = sorted(((float(unit[i] @ unit[j]), j) for j in targets), reverse=True)
        best_score[i], best[i] = scores[0]
        second = scores[1][0] if len(scores) > 1 else -math.inf
        margins.append((i, scores[0][0] - second))
    ranked = sorted(sources, key=lambda i: best_score[i], reverse=True)
    merged = set(ranked[:r])
    gaps = [m for i, m in margins if i in merged]
    if r < len(ranked):
        gaps.append(best_score[ranked[r - 1]] - best_score[ranked[r]])
    total = {j: sizes[j] * x[j] for j in targets}
    size = {j: sizes[j] for j in targets}
    for i in merged:
        total[best[i]] = total[best[i]] + sizes[i] * x[i]
        size[best[i]] = size[best[i]] + sizes[i]
    order = list(range(num_prefix)) + [i for i in sources if i not in merged]
    new_x = [x[i] for i in order] + [total[j] / size[j] for j in targets]
    new_sizes = [sizes[i] for i in order] + [size[j] for j in targets]
    return np.array(new_x), np.array(new_sizes), min(gaps), math.inf


def prune_image(x, sizes, cls_attn, keep, num_prefix):
    """EViT on one image's tokens x (t, D) with sizes (t,): keeps the `keep` non-prefix tokens
    of highest cls_attn (n,), in descending order, and fuses the rest into one token
    sum_j cls_attn_j x_j of their summed size. Returns the tokens, sizes, the gap between the
    last kept and the first fused token's attention (which decides what is kept) and the
    smallest gap between two kept ones (which decides only their order)."""
    n = len(x) - num_prefix
    if keep >= n:
        return x, sizes, math.inf, math.inf
    ranked = sorted(range(n), key=lambda j: cls_attn[j], reverse=True)
    values = [cls_attn[j] for j in ranked]
    order_gap = min([values[k] - values[k + 1] for k in range(keep - 1)], default=math.inf)
    kept, rest = ranked[:keep], ranked[keep:]
    fused = sum(cls_attn[j] * x[num_prefix + j] for j in rest)
    fused_size = sum(sizes[num_prefix + j] for j in rest)
    new_x = [x[i] for i in range(num_prefix)] + [x[num_prefix + j] for j in kept] + [fused]
    new_sizes = ([sizes[i] for i in range(num_prefix)] + [sizes[num_prefix + j] for j in kept]
                 + [fused_size])
    return np.array(new_x), np.array(new_sizes), values[keep - 1] - values[keep], order_gap


def merge_schedule(r, layers):
    if isinstance(r, (list, tuple)):
        assert len(r) == layers
        return list(r)
    return [r] * layers


def prune_blocks(blocks, layers):
    """EViT's places by default: a quarter, a half and three quarters of the way (0-based
    depth // 4, depth // 2, 3 * depth // 4: 3, 6, 9 of 12)."""
    if blocks is None:
        blocks = [layers // 4, layers // 2, 3 * layers // 4]
    return {b % layers for b in blocks}


def read_out(params, x, sizes, num_prefix, classifier, distilled, fc_norm, representation,
             weighted):
    """The final LayerNorm (before pooling, or fc_norm after it), the pooling and the heads:
    (pooled representation, logits or None without a head). "gap" averages the non-prefix
    tokens, weighted by their sizes when weighted (ToMe); DeiT's logits are its two heads'
    mean on its two tokens."""
    if not fc_norm:
        x = layer_norm(x, params["Transformer/encoder_norm/scale"],
                       params["Transformer/encoder_norm/bias"])
    if distilled:
        logits = ((x[:, 0] @ params["head/kernel"] + params["head/bias"])
                  + (x[:, 1] @ params["head_dist/kernel"] + params["head_dist/bias"])) / 2
        return x[:, :2].mean(1), logits
    if classifier == "token":
        pooled = x[:, 0]
    else:
        w = sizes[:, num_prefix:, None] if weighted else np.ones_like(x[:, num_prefix:, :1])
        pooled = (w * x[:, num_prefix:]).sum(1) / w.sum(1)
    if fc_norm:
        pooled = layer_norm(pooled, params["fc_norm/scale"], params["fc_norm/bias"])
    if representation:
        pooled = np.tanh(pooled @ params["pre_logits/kernel"] + params["pre_logits/bias"])
    if "head/kernel" not in params:
        return pooled, None
    return pooled, pooled @ params["head/kernel"] + params["head/bias"]


def forward(params, images, *, patch, heads, layers, r=None, keep_rate=None, blocks=None,
            classifier="token", class_token=None, distilled=False, num_register_tokens=0,
            fc_norm=False, representation=False, proportional=True, approximate=True):
    """The forward pass with merging (r: an int, or one per block) or pruning (keep_rate at
    blocks, EViT's by default), or neither. proportional=False leaves out ToMe's log(size)
    attention bias (for tests that show it matters).

    Returns a dict: "logits" and "pooled" (the representation the head reads); per block
    "tokens" (B, t_i, D), "sizes" (B, t_i) and "counts" (t_i); "margin", the smallest score
    gap behind any decision of which tokens merge or stay (the logits depend on these), and
    "order_margin", the smallest behind the order of the tokens EViT keeps (only the tokens'
    order depends on it)."""
    assert r is None or keep_rate is None
    class_token = classifier == "token" or distilled if class_token is None else class_token
    num_prefix = int(class_token) + int(distilled) + num_register_tokens
    x = embed(params, images.astype(np.float64), patch, class_token, distilled,
              num_register_tokens)
    sizes = np.ones(x.shape[:2])
    schedule = merge_schedule(r if r is not None else 0, layers)
    pruned_at = prune_blocks(blocks, layers) if keep_rate is not None else set()
    out = {"tokens": [], "sizes": [], "counts": [], "margin": math.inf,
           "order_margin": math.inf}
    for i in range(layers):
        prefix = f"Transformer/encoderblock_{i}/"
        p = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
        y = layer_norm(x, p["LayerNorm_0/scale"], p["LayerNorm_0/bias"])
        update, probs, keys = attention(y, p, heads, sizes if r is not None and proportional
                                        else None)
        x = x + update
        images_out = []
        for b in range(len(x)):
            if i in pruned_at:
                n = x.shape[1] - num_prefix
                keep = math.ceil(keep_rate * n)
                cls_attn = probs[b, :, 0, num_prefix:].mean(0)
                images_out.append(prune_image(x[b], sizes[b], cls_attn, keep, num_prefix))
            else:
                images_out.append(merge_image(x[b], sizes[b], keys[b].mean(1), schedule[i],
                                              num_prefix))
        x = np.stack([o[0] for o in images_out])
        sizes = np.stack([o[1] for o in images_out])
        out["margin"] = min([out["margin"], *(o[2] for o in images_out)])
        out["order_margin"] = min([out["order_margin"], *(o[3] for o in images_out)])
        x = mlp(x, p, approximate)
        out["tokens"].append(x)
        out["sizes"].append(sizes)
        out["counts"].append(x.shape[1])
    out["pooled"], out["logits"] = read_out(params, x, sizes, num_prefix, classifier, distilled,
                                            fc_norm, representation, weighted=r is not None)
    return out


def merged_counts(tokens, num_prefix, r):
    """The tokens each block outputs under ToMe's cap, from the rule alone."""
    counts = []
    for r_i in r:
        tokens -= min(r_i, (tokens - num_prefix) // 2)
        counts.append(tokens)
    return counts


def pruned_counts(tokens, num_prefix, keep_rate, blocks, layers):
    """The tokens each block outputs under EViT's rule at the given blocks, from the rule
    alone."""
    counts = []
    for i in range(layers):
        n = tokens - num_prefix
        if i in blocks and math.ceil(keep_rate * n) < n:
            tokens = num_prefix + math.ceil(keep_rate * n) + 1
        counts.append(tokens)
    return counts
