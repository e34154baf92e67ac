"""Every backend-specific kernel choice of the model, chosen in one place (FAST_PATHS, uses)
so that the layers read as the paper. This is the only module of the model that names a
backend.

A fast path computes what a general Keras path computes, faster on the backends where the
benchmark shows it paying (docs/performance.md); everywhere else, and wherever
VIT_KERAS_FAST_PATHS=0 is set in the environment when vit_keras is imported, the general path
runs. A fast path whose private PyTorch or Keras names fail compat's check turns off too.

attention, softmax(q k^T / sqrt(D_h) + bias) v over (batch, tokens, heads, D_h) tensors, the
optional bias (batch, heads, tokens, tokens) added to the logits (relative position
embeddings), runs the kernel attention_route picks:
- "einsum": keras.ops einsums in head-major layout, softmax in float32; the only kernel that
  can return the probabilities or apply attention dropout, so those always take it.
- "torch": PyTorch's scaled_dot_product_attention, called directly (a float attn_mask is its
  additive bias, and torch's dispatcher picks among the kernels that take one).
- "keras": keras.ops.dot_product_attention, the backend's fused kernel where it has one.
Under attention_kernel "auto" a bias never reaches a fused kernel on an accelerator: Keras on a
TPU may pick the Splash kernel, which takes no bias, and cuDNN's fused attention limits the
bias gradient; "fused" with a bias there is refused.

dense, layer_norm and patch_embedding compute what a Dense or EinsumDense, LayerNormalization
or PatchEmbedding layer's call returns, from its variables: the blocks' direct path
(vit_keras.layers). On PyTorch they are torch ops on the variables' tensors, since in eager
mode a Keras layer call costs many times the arithmetic of a small model (docs/performance.md,
host overhead).

conv2d, group_norm, max_pool and standardized_kernel compute what the hybrids' Conv2D,
GroupNormalization, MaxPooling2D and StdConv return on channels-last maps (vit_keras.resnet).
On PyTorch the convolution and the pool are torch's own kernels on channels-first views of
maps that stay channels-last in memory, where torch's CPU kernels run fastest; group_norm is
an autograd function of its own on those maps, which also adds a residual and applies a ReLU.

clip_by_global_norm_fused gives an optimizer torch's multi-tensor norm and scale for its
global-norm clipping on PyTorch, where Keras runs two operations per gradient; adam_update_fused
gives an Adam or AdamW optimizer torch's fused Adam kernel for its update, one call where Keras
runs about ten multi-tensor operations, each a loop over the variables on a CPU.

constant gives a layer's fixed NumPy table (sincos2d) as its call takes it: on PyTorch a tensor
made once, since torch.compile cannot trace converting an array.
"""

from __future__ import annotations

import dataclasses
import math
import os

import keras
from keras import ops

from vit_keras import compat

# The switch, read once when vit_keras is imported (as timm reads TIMM_FUSED_ATTN): "0" runs
# the general path everywhere.
FAST_PATHS_VARIABLE = "VIT_KERAS_FAST_PATHS"
FAST_PATHS_ON = os.environ.get(FAST_PATHS_VARIABLE, "1") != "0"


@dataclasses.dataclass(frozen=True)
class FastPath:
    """One fast path: what it replaces, the backends where the benchmark shows it paying, and
    the compat features (private names) it needs."""

    replaces: str
    backends: tuple[str, ...]
    needs: tuple[str, ...] = ()


FAST_PATHS = {
    "direct_layers": FastPath("the blocks' Dense, LayerNormalization and patch embedding calls",
                              ("torch",)),
    "torch_attention": FastPath("keras.ops.dot_product_attention, and the einsums under 'auto'",
                                ("torch",)),
    "jax_attention": FastPath("the einsums under 'auto' on an accelerator", ("jax",)),
    "channels_last_convolution": FastPath(
        "the hybrids' Conv2D, GroupNormalization, MaxPooling2D and kernel standardisation",
        ("torch",)),
    "multi_tensor_clipping": FastPath("Keras' global-norm gradient clipping", ("torch",),
                                      ("optimizer_replacements", "foreach")),
    "fused_adam": FastPath("Keras' Adam and AdamW update", ("torch",),
                           ("optimizer_replacements", "adam_slots", "fused_adam")),
}


def uses(name: str) -> bool:
    """Whether fast path `name` (a key of FAST_PATHS) runs: the switch is on, the backend is
    one where it pays, and compat's checks pass for every private name it needs."""
    path = FAST_PATHS[name]
    return (FAST_PATHS_ON and keras.backend.backend() in path.backends
            and all(compat.supports(feature) for feature in path.needs))


ATTENTION_KERNELS = ("auto", "fused", "einsum")


def check_attention_kernel(kernel: str) -> str:
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}: expected one of "
                         f"{', '.join(ATTENTION_KERNELS)}")
    return kernel


def device_kind(tensor) -> str:
    """"cpu", "gpu" or "tpu": the kind of device `tensor` lives on (a JAX value being traced
    lives where JAX places the computation, its default backend)."""
    backend = keras.backend.backend()
    if backend == "torch":
        kind = tensor.device.type
        return {"cuda": "gpu", "mps": "gpu", "xpu": "gpu", "xla": "tpu"}.get(kind, kind)
    if backend == "jax":
        import jax

        if isinstance(tensor, jax.core.Tracer):
            return jax.default_backend()
        return next(iter(tensor.devices())).platform
    device = getattr(tensor, "device", "") or ""
    return "gpu" if ":GPU:" in device else "tpu" if ":TPU:" in device else "cpu"


def attention_route(backend: str, device: str, kernel: str = "auto", bias: bool = False,
                    dropout: bool = False, probabilities: bool = False,
                    fast_paths: bool = True) -> str:
    """The attention kernel for a call: "einsum", "torch" or "keras" (the module docstring).

    Args:
        backend: Keras' backend.
        device: the kind of device the tensors live on: "cpu", "gpu" or "tpu".
        kernel: the layer's attention_kernel: "auto", "fused" or "einsum".
        bias: whether a bias is added to the logits.
        dropout: whether attention dropout applies.
        probabilities: whether the call returns the probabilities.
        fast_paths: whether the backend's attention fast path runs (uses("torch_attention"),
            uses("jax_attention")).

    Returns:
        The kernel's name.

    Raises:
        ValueError: "fused" with a bias on JAX on an accelerator, whose fused kernels drop or
            limit it.
    """
    if probabilities or dropout or kernel == "einsum":
        return "einsum"
    accelerator = device != "cpu"
    if kernel == "fused":
        if bias and backend == "jax" and accelerator:
            raise ValueError(f"attention_kernel='fused' with a logit bias (relative position "
                             f"embeddings) on JAX on a {device}: Keras' fused kernels there "
                             "take no bias (Splash on a TPU) or limit its gradient (cuDNN); "
                             "expected attention_kernel 'auto' or 'einsum'")
        return "torch" if backend == "torch" and fast_paths else "keras"
    if backend == "torch" and fast_paths and not (bias and accelerator):
        return "torch"
    if backend == "jax" and fast_paths and accelerator and not bias:
        return "keras"
    return "einsum"


def einsum_attention(query, key, value, dropout=None, training=None, bias=None):
    """(attended values (batch, tokens, heads, D_h), probabilities (batch, heads, tokens,
    tokens)); the query is scaled before its dot with the keys, as Flax does, and the bias
    added to the logits in float32."""
    query, key, value = (ops.transpose(t, (0, 2, 1, 3)) for t in (query, key, value))
    query = query / ops.cast(math.sqrt(ops.shape(query)[-1]), query.dtype)
    logits = ops.cast(ops.einsum("bhqk,bhtk->bhqt", query, key), "float32")
    if bias is not None:
        logits = logits + ops.cast(bias, "float32")
    probs = ops.cast(ops.softmax(logits, axis=-1), value.dtype)
    weights = dropout(probs, training=training) if dropout is not None else probs
    attended = ops.einsum("bhqt,bhtk->bhqk", weights, value)
    return ops.transpose(attended, (0, 2, 1, 3)), probs


def torch_attention(query, key, value, bias=None):
    """PyTorch's scaled_dot_product_attention on (batch, tokens, heads, D_h) tensors, called
    directly: Keras' op first probes which of torch's kernels applies, which costs an eager
    call time and breaks torch.compile's graph at every attention."""
    import torch

    query, key, value = (t.transpose(1, 2) for t in (query, key, value))
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias).transpose(1, 2)


def attention(query, key, value, kernel: str = "auto", dropout=None, training=None,
              return_probabilities: bool = False, bias=None):
    """Attended values, and the probabilities (None from a fused kernel), by the kernel
    attention_route picks. dropout: a Keras Dropout layer for the probabilities, or None;
    bias: added to the logits, or None."""
    backend = keras.backend.backend()
    fast = backend in ("torch", "jax") and uses(f"{backend}_attention")
    route = attention_route(backend, device_kind(query), kernel, bias is not None,
                            dropout is not None, return_probabilities, fast)
    if route == "einsum":
        return einsum_attention(query, key, value, dropout, training, bias)
    if bias is not None:
        bias = ops.cast(bias, query.dtype)
    if route == "torch":
        return torch_attention(query, key, value, bias), None
    return ops.dot_product_attention(query, key, value, bias=bias), None


def multi_head_attention(query, key, value, num_heads: int, kernel: str = "auto", bias=None):
    """attention() on (batch, tokens, heads * D_h) projections, in and out, on the direct path
    (uses("direct_layers"), PyTorch): the heads split and merged by the tensors' own reshape
    around the kernel."""
    batch, tokens, width = query.shape
    heads = (batch, tokens, num_heads, width // num_heads)
    query, key, value = (t.reshape(heads) for t in (query, key, value))
    attended, _ = attention(query, key, value, kernel, bias=bias)
    return attended.reshape(batch, tokens, width)


def dense(x, layer):
    """layer(x) for a Dense or EinsumDense layer whose call is x times its kernel plus its
    bias (no LoRA, no quantized kernel), over x's last axis, on the direct path (PyTorch): the
    kernel as an (inputs, outputs) matrix, the outputs flattened into the last axis."""
    import torch

    # The variable itself: the public kernel property works out LoRA and quantized kernels
    # first, which costs an eager call more than a small matmul.
    kernel, bias = compat.base_kernel(layer), layer.bias
    y = torch.matmul(x, kernel.value.reshape(x.shape[-1], -1))
    return y if bias is None else y + bias.value.reshape(-1)


def layer_norm(x, layer):
    """layer(x) for a LayerNormalization layer over the last axis: computed in at least
    float32, returned in the layer's compute dtype: on the general path, the layer's call."""
    if not uses("direct_layers"):
        return layer(x)
    import torch

    if x.dtype.itemsize < 4:  # float16, bfloat16
        x = x.float()
    out = torch.nn.functional.layer_norm(x, x.shape[-1:], layer.gamma.value, layer.beta.value,
                                         layer.epsilon)
    return ops.cast(out, layer.compute_dtype)


def group_norm(x, layer, relu: bool = False, residual=None):
    """layer(x) for a GroupNormalization layer over the last axis of (batch, height, width,
    channels) maps, plus residual where given, then a ReLU where relu: computed in at least
    float32, returned in the layer's compute dtype. On PyTorch one autograd function
    (CHANNELS_LAST_GROUP_NORM) does all three on the channels-last maps where they lie:
    torch's own kernel copies them or runs slowly on them, and the sum and the ReLU after a
    norm are passes over the maps of their own."""
    if not (uses("channels_last_convolution") and len(x.shape) == 4 and layer.axis in (-1, 3)
            and layer.scale and layer.center):
        y = keras.layers.GroupNormalization.call(layer, x)
        y = y if residual is None else y + residual
        return ops.relu(y) if relu else y
    out = CHANNELS_LAST_GROUP_NORM.apply(
        x.float(), layer.gamma.value.float(), layer.beta.value.float(),
        None if residual is None else residual.float(), layer.groups, layer.epsilon, relu)
    return ops.cast(out, layer.compute_dtype)


def _channels_last_group_norm():
    """A torch.autograd.Function: GroupNorm of float32 channels-last maps, plus an optional
    residual, then an optional ReLU. The statistics come from per-channel sums over the map
    (the variance as E[x^2] - E[x]^2, as torch's channels-last kernel computes it); the
    output is x * scale + shift in one pass, the input's gradient grad * scale + x * k1 + k2
    in two, after two per-channel sums."""
    import torch

    def per_group(sums, groups):  # (batch, channels) -> (batch, groups, 1)
        return sums.view(sums.shape[0], groups, -1).sum(2, keepdim=True)

    def per_channel(values, channels):  # (batch, groups, 1 or per group) -> (batch, 1, channels)
        return values.expand(-1, -1, channels // values.shape[1]).reshape(-1, 1, channels)

    class ChannelsLastGroupNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, gamma, beta, residual, groups, epsilon, relu):
            batch, channels = x.shape[0], x.shape[-1]
            flat = x.reshape(batch, -1, channels)
            count = flat.shape[1] * (channels // groups)
            mean = per_group(flat.sum(1), groups) / count
            variance = per_group(flat.square().sum(1), groups) / count - mean.square()
            rstd = torch.rsqrt(variance.clamp_(min=0) + epsilon)
            scale = gamma.view(groups, -1) * rstd  # (batch, groups, channels per group)
            shift = beta.view(groups, -1) - mean * scale
            out = torch.addcmul(per_channel(shift, channels), flat, per_channel(scale, channels))
            if residual is not None:
                out += residual.reshape(batch, -1, channels)
            if relu:
                out.clamp_(min=0)
            ctx.save_for_backward(x, gamma, mean, rstd, out if relu else None)
            ctx.groups, ctx.has_residual = groups, residual is not None
            return out.view(x.shape)

        @staticmethod
        def backward(ctx, grad):
            x, gamma, mean, rstd, out = ctx.saved_tensors
            batch, channels, groups = x.shape[0], x.shape[-1], ctx.groups
            flat, grad = x.reshape(batch, -1, channels), grad.reshape(batch, -1, channels)
            if out is not None:  # the ReLU's gradient, as torch's ReLU computes it
                grad = torch.ops.aten.threshold_backward(grad, out, 0)
            count = flat.shape[1] * (channels // groups)
            sums = grad.sum(1).view(batch, groups, -1)  # per channel: sum of grad
            dots = (grad * flat).sum(1).view(batch, groups, -1)  # and of grad * x
            gamma = gamma.view(groups, -1)
            grad_gamma = ((dots - mean * sums) * rstd).sum(0).reshape(channels)
            grad_beta = sums.sum(0).reshape(channels)
            gamma_sums = (gamma * sums).sum(2, keepdim=True)
            gamma_dots = (gamma * dots).sum(2, keepdim=True)
            k1 = (mean * gamma_sums - gamma_dots) * rstd.pow(3) / count
            k2 = -rstd * gamma_sums / count - k1 * mean
            grad_x = torch.addcmul(per_channel(k2, channels), grad,
                                   per_channel(gamma * rstd, channels))
            grad_x.addcmul_(flat, per_channel(k1, channels))
            grad_residual = grad.view(x.shape) if ctx.has_residual else None
            return grad_x.view(x.shape), grad_gamma, grad_beta, grad_residual, None, None, None

    return ChannelsLastGroupNorm


# made once, on import: torch.compile traces a call of the function, not a class definition
CHANNELS_LAST_GROUP_NORM = (_channels_last_group_norm()
                            if keras.backend.backend() == "torch" else None)


def patch_embedding(images, layer):
    """layer(images) for a PatchEmbedding layer: its kernel (P, P, C, D) as a strided "valid"
    convolution over channels-last images, plus its bias, as (batch, grid_h * grid_w, D)
    tokens (rows and columns past the last whole patch left out)."""
    kernel, size = layer.kernel, layer.patch_size
    if not uses("direct_layers"):
        x = ops.conv(images, kernel, strides=size, padding="valid")
        if layer.use_bias:
            x = x + layer.bias
        _, grid_h, grid_w, _ = ops.shape(x)
        return ops.reshape(x, (-1, grid_h * grid_w, kernel.shape[-1]))
    batch, height, width, channels = images.shape
    grid_h, grid_w = height // size, width // size
    patches = images[:, :grid_h * size, :grid_w * size].reshape(
        batch, grid_h, size, grid_w, size, channels).transpose(2, 3)
    patches = patches.reshape(batch, grid_h * grid_w, size * size * channels)
    tokens = patches @ kernel.value.reshape(size * size * channels, -1)
    return tokens + layer.bias.value if layer.use_bias else tokens


def constant(array):
    """A fixed NumPy array a layer adds in its call, as that call should take it: on PyTorch a
    CPU tensor made once (torch.compile cannot trace converting an array, and the call's
    convert_to_tensor moves it to the device), elsewhere the array, which TensorFlow and JAX
    fold into their graphs."""
    if keras.backend.backend() != "torch":
        return array
    import torch

    return torch.from_numpy(array)


def same_padding(sides, sizes, strides) -> list[tuple[int, int]]:
    """TensorFlow's "same" padding of each spatial side: (before, after), the odd one after."""
    totals = (max((-(-side // stride) - 1) * stride + size - side, 0)
              for side, size, stride in zip(sides, sizes, strides, strict=True))
    return [(total // 2, total - total // 2) for total in totals]


def conv2d(x, kernel, layer):
    """layer.convolution_op(x, kernel) for a channels-last Conv2D layer: kernel (height,
    width, inputs, outputs), "same" padding by TensorFlow's rule. On PyTorch without dilation
    or groups, torch's convolution on channels-last memory."""
    if not (uses("channels_last_convolution") and layer.data_format == "channels_last"
            and layer.groups == 1 and max(layer.dilation_rate) == 1):
        return keras.layers.Conv2D.convolution_op(layer, x, kernel)
    import torch

    images = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    weights = kernel.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    (top, bottom), (left, right) = (same_padding(x.shape[1:3], layer.kernel_size, layer.strides)
                                    if layer.padding == "same" else [(0, 0), (0, 0)])
    if (top, left) != (bottom, right):  # torch pads evenly: the odd row or column by hand
        images = torch.nn.functional.pad(images, (left, right, top, bottom))
        top = left = 0
    out = torch.nn.functional.conv2d(images, weights, stride=layer.strides, padding=(top, left))
    return out.permute(0, 2, 3, 1)


def standardized_kernel(kernel, epsilon: float, dtype):
    """A convolution kernel (height, width, inputs, outputs) standardised per output filter:
    zero mean and unit standard deviation (plus epsilon) over the rest, computed in float32
    (a bfloat16 mean and variance would lose small filters), returned in dtype (the
    backend's, as a tensor's dtype is)."""
    if uses("channels_last_convolution"):
        kernel = (kernel.value if isinstance(kernel, keras.Variable) else kernel).float()
        centred = kernel - kernel.mean(dim=(0, 1, 2), keepdim=True)
        std = centred.square().mean(dim=(0, 1, 2), keepdim=True).sqrt()
        return (centred / (std + epsilon)).to(dtype)
    kernel = ops.cast(kernel, "float32")
    centred = kernel - ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
    std = ops.sqrt(ops.mean(ops.square(centred), axis=(0, 1, 2), keepdims=True))
    return ops.cast(centred / (std + epsilon), dtype)


def max_pool(x, layer):
    """layer(x) for a channels-last MaxPooling2D layer. "same" padding follows TensorFlow's
    rule: total // 2 rows and columns of -inf before, the rest after. On PyTorch, torch pads
    total // 2 on both sides and ceil_mode adds the odd one after, which a stride of 2 or more
    allows (with strides no larger than the pool); other pools take Keras' path."""
    strides, sizes = layer.strides, layer.pool_size
    if (not uses("channels_last_convolution") or layer.data_format != "channels_last"
            or min(strides) < 2
            or any(stride > size for stride, size in zip(strides, sizes, strict=True))):
        return keras.layers.MaxPooling2D.call(layer, x)
    import torch

    padding = (0, 0)
    if layer.padding == "same":
        padding = tuple(before for before, _ in same_padding(x.shape[1:3], sizes, strides))
    # contiguous() makes the channels-first view channels-last in memory, where torch's CPU
    # kernel pools faster
    pooled = torch.nn.functional.max_pool2d(x.contiguous().permute(0, 3, 1, 2), sizes, strides,
                                            padding, ceil_mode=layer.padding == "same")
    return pooled.permute(0, 2, 3, 1)


def clip_by_global_norm_fused(optimizer) -> None:
    """On PyTorch, optimizer's global-norm clipping (global_clipnorm) by torch's multi-tensor
    norm and product: Keras sums each gradient's squares with operations of its own, two
    dispatches per variable. The scale is Keras': min(1, global_clipnorm / norm), NaN where
    the norm is not finite. Read at every step; without global_clipnorm, or with Keras' other
    clipping set, Keras' own clipping runs."""
    if not uses("multi_tensor_clipping"):
        return
    import torch

    keras_clip = compat.keras_clip_gradients(optimizer)

    def clip_gradients(grads):
        limit = optimizer.global_clipnorm
        if not limit or optimizer.clipnorm or optimizer.clipvalue:
            return keras_clip(optimizer, grads)
        present = [grad for grad in grads if grad is not None]
        norm = torch.linalg.vector_norm(torch.stack(compat.foreach_norm(present)))
        scale = torch.clamp(limit / norm, max=1.0) + (norm - norm)
        clipped = iter(compat.foreach_mul(present, scale))
        return [None if grad is None else next(clipped) for grad in grads]

    compat.set_clip_gradients(optimizer, clip_gradients)


def adam_update_fused(optimizer) -> None:
    """On PyTorch, a Keras Adam or AdamW optimizer's update of contiguous CPU variables of one
    dtype by torch's fused Adam kernel, with Keras' formula: torch adds epsilon after dividing
    sqrt(v) by sqrt(1 - beta_2^t), Keras before, so the kernel gets epsilon / sqrt(1 - beta_2^t).
    Variables elsewhere (on an accelerator the step count would have to be read back to the
    host), amsgrad, and steps inside torch.compile (whose functionalization refuses the
    kernel's in-place update) take Keras' update; weight decay and clipping stay Keras'."""
    keras_update = compat.keras_parallel_update(optimizer)
    if not (uses("fused_adam") and keras_update
            and isinstance(optimizer, keras.optimizers.Adam)):
        return
    import torch

    def update(grads, variables, learning_rate):
        values = [variable.value for variable in variables]
        if (optimizer.amsgrad or torch.compiler.is_compiling()
                or {value.device.type for value in values} != {"cpu"}
                or len({value.dtype for value in values} | {g.dtype for g in grads}) != 1
                or not all(value.is_contiguous() for value in values)):
            return keras_update(optimizer, grads, variables, learning_rate)
        slots = [compat.adam_slots(optimizer, compat.variable_index(optimizer, variable))
                 for variable in variables]
        step = int(optimizer.iterations) + 1
        compat.fused_adam_(  # it walks the tensors' memory in order: grads laid out as values
            values, [grad.contiguous() for grad in grads],
            [momentum.value for momentum, _ in slots],
            [velocity.value for _, velocity in slots], [],
            [torch.tensor(float(step))] * len(values), lr=float(learning_rate),
            beta1=optimizer.beta_1, beta2=optimizer.beta_2, weight_decay=0.0,
            eps=optimizer.epsilon / math.sqrt(1 - optimizer.beta_2 ** step), amsgrad=False,
            maximize=False)

    compat.set_parallel_update(optimizer, update)
