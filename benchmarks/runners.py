"""The implementations a benchmark measures, built from one config: ours (vit_keras), timm's
VisionTransformer on PyTorch and keras-hub's ViTBackbone with a 1000-class head. A runner is a
dict of calls ("infer", "latency" at batch 1, "train": one step) and facts ("params",
"jit_compile"). Also the model's FLOP count, from its shape."""

import dataclasses

import keras
import numpy as np

import vit_keras as vk
from apps.train import MAIN_JOB_MODEL
from benchmarks import (
    JIT_COMPILE,
    OVERHEAD_IMAGE_SIZE,
    OVERHEAD_MODEL,
    SMOKE_IMAGE_SIZE,
    SMOKE_MODEL,
)
from benchmarks.device import on_device, synchronize, torch_device

OURS = "vit_keras"
# The main job's model's shape (apps.train.MAIN_JOB_MODEL), and as the plain ViT the peers can
# build: its blocks on its tokens, each patch one of the hybrid's cells (the ResNet left out).
MAIN_JOB_CONFIG = vk.ViTConfig(**{key: MAIN_JOB_MODEL[key] for key in (
    "hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size", "resnet_layers",
    "resnet_width")})
MAIN_JOB_BLOCKS = dataclasses.replace(MAIN_JOB_CONFIG, patch_size=MAIN_JOB_CONFIG.cell_size,
                                      resnet_layers=None)


def model_spec(name: str, image_size: int) -> tuple[vk.ViTConfig, int]:
    """The config and image size of a variant name, "main" (the main job's model's blocks and
    tokens as a plain ViT, at its image size), "smoke" (a tiny model at 32 px) or "overhead"
    (B/16's depth, tiny width, 32 px)."""
    if name == "main":
        return MAIN_JOB_BLOCKS, MAIN_JOB_MODEL["image_size"]
    if name == "smoke":
        return vk.ViTConfig(**SMOKE_MODEL), SMOKE_IMAGE_SIZE
    if name == "overhead":
        return vk.ViTConfig(**OVERHEAD_MODEL), OVERHEAD_IMAGE_SIZE
    return vk.get_config(name), image_size


# A training step's FLOPs per forward FLOP: the backward pass computes two products (the
# inputs' and the weights' gradients) per product of the forward.
TRAIN_FLOPS_PER_FORWARD = 3


def forward_flops(config: vk.ViTConfig, image_size: int, num_classes: int = 1000,
                  class_token: bool = True) -> float:
    """2 x multiply-accumulates of one forward pass (class_token=False: global average pooling,
    no token beside the patches'); a hybrid's ResNet counts its convolutions."""
    macs, channels = resnet_macs(config, image_size) if config.is_hybrid else (0, 3)
    patches = (image_size // config.cell_size) ** 2
    tokens, d, m = patches + class_token, config.hidden_size, config.mlp_dim
    macs += patches * config.patch_size**2 * channels * d
    macs += config.num_layers * block_macs(tokens, tokens, d, m)
    return 2.0 * (macs + d * num_classes)


def block_macs(tokens: int, kept: int, hidden: int, mlp: int) -> int:
    """Multiply-accumulates of one encoder block whose attention runs on `tokens` and whose MLP
    on the `kept` of them: the four projections, the scores and their weighted sum, the MLP."""
    return 4 * tokens * hidden * hidden + 2 * tokens * tokens * hidden + 2 * kept * hidden * mlp


def resnet_macs(config: vk.ViTConfig, image_size: int) -> tuple[int, int]:
    """Multiply-accumulates of a hybrid's ResNet convolutions on one image (vit_keras.resnet:
    the 7x7/2 root, the max-pool, bottleneck units with the stride on their 3x3), and the
    channels of its feature map."""
    side = -(-image_size // 2)  # SAME padding: ceil
    macs = side * side * 7 * 7 * 3 * config.resnet_width
    side, channels = -(-side // 2), config.resnet_width
    for stage, units in enumerate(config.resnet_layers):
        features = config.resnet_width * 2**stage
        for unit in range(units):
            strided = stage > 0 and unit == 0
            out = -(-side // 2) if strided else side
            macs += side * side * channels * features + out * out * 9 * features * features
            macs += out * out * features * 4 * features
            if channels != 4 * features or strided:
                macs += out * out * channels * 4 * features  # the projected shortcut
            side, channels = out, 4 * features
    return macs, channels


def keras_runner(build, image_size, precision, batch, jit_compile="auto") -> dict:
    """A Keras classifier made by build() under the precision's dtype policy, compiled with
    jit_compile, and its calls, on inputs already on the backend's device. Its calls return
    NumPy values, so each waits for the device."""
    keras.config.set_dtype_policy("mixed_bfloat16" if precision == "bfloat16" else "float32")
    try:
        model = build()
        model.compile(keras.optimizers.Adam(1e-4),
                      keras.losses.CategoricalCrossentropy(from_logits=True),
                      jit_compile=jit_compile)
    finally:
        keras.config.set_dtype_policy("float32")
    x = np.random.default_rng(0).uniform(-1, 1, (batch, image_size, image_size, 3))
    x = x.astype("float32")
    first, x = on_device(x[:1]), on_device(x)
    y = on_device(np.eye(1000, dtype="float32")[np.arange(batch) % 1000])
    return {"params": model.count_params(), "jit_compile": model.jit_compile,
            "infer": lambda: model.predict_on_batch(x),
            "latency": lambda: model.predict_on_batch(first),
            "train": lambda: model.train_on_batch(x, y)}


def ours_runner(config, image_size, precision, batch, jit_compile="auto", approximate_gelu=True):
    """approximate_gelu=False: the exact GELU that timm and keras-hub compute, for a
    like-for-like comparison."""
    return keras_runner(lambda: vk.vit(config, image_size=image_size, num_classes=1000,
                                       approximate_gelu=approximate_gelu),
                        image_size, precision, batch, jit_compile)


def timm_runner(config, image_size, precision, batch, compiled=False, device="cpu") -> dict:
    """timm eager, or under torch.compile; bfloat16 through torch.autocast. The model and
    inputs on `device` (torch's name), each call waiting for it."""
    import torch
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(
        img_size=image_size, patch_size=config.patch_size, embed_dim=config.hidden_size,
        depth=config.num_layers, num_heads=config.num_heads,
        mlp_ratio=config.mlp_dim / config.hidden_size, num_classes=1000).to(device)
    x = torch.randn(batch, 3, image_size, image_size, device=device)
    y = torch.arange(batch, device=device) % 1000
    kind = torch.device(device).type
    autocast = (lambda: torch.autocast(kind, dtype=torch.bfloat16)) if precision == "bfloat16" \
        else (lambda: torch.autocast(kind, enabled=False))
    step_model = torch.compile(model) if compiled else model
    optimizer = torch.optim.Adam(model.parameters(), 1e-4)

    def infer(images):
        with torch.no_grad(), autocast():
            step_model.eval()(images)
        synchronize(device)

    def train_step():
        with autocast():
            loss = torch.nn.functional.cross_entropy(step_model.train()(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        synchronize(device)

    return {"params": sum(p.numel() for p in model.parameters()), "jit_compile": compiled,
            "infer": lambda: infer(x), "latency": lambda: infer(x[:1]), "train": train_step}


def keras_hub_runner(config, image_size, precision, batch):
    """Compiled with Keras' "auto", what keras-hub's users get without flags."""
    import keras_hub

    def build():
        backbone = keras_hub.models.ViTBackbone(
            image_shape=(image_size, image_size, 3), patch_size=config.patch_size,
            num_layers=config.num_layers, num_heads=config.num_heads,
            hidden_dim=config.hidden_size, mlp_dim=config.mlp_dim)
        inputs = keras.Input((image_size, image_size, 3))
        pooled = backbone(inputs)[:, 0]
        return keras.Model(inputs, keras.layers.Dense(1000, dtype="float32")(pooled))

    return keras_runner(build, image_size, precision, batch)


def ours_name(jit_compile: str, first: bool) -> str:
    """Our row's name: OURS for the first --jit-compile value, with the value for the others."""
    return OURS if first else f"{OURS} jit_compile={jit_compile}"


def runner_factories(config, image_size, precision, batch, peers, jit_compile=("auto",),
                     torch_compile=False, exact_gelu=False) -> dict:
    """Every implementation the run measures, by name, as a function that builds its runner:
    ours once per jit_compile value ("auto", "true", "false"), the exact-GELU build with the
    first of them, and the available peers."""
    make = {ours_name(value, i == 0): lambda value=value: ours_runner(
        config, image_size, precision, batch, JIT_COMPILE[value])
        for i, value in enumerate(jit_compile)}
    if exact_gelu:
        make[f"{OURS}-erf-gelu"] = lambda: ours_runner(
            config, image_size, precision, batch, JIT_COMPILE[jit_compile[0]],
            approximate_gelu=False)
    if peers.get("timm") is True:
        device = torch_device()
        make["timm"] = lambda: timm_runner(config, image_size, precision, batch, device=device)
        if torch_compile:
            make["timm-compile"] = lambda: timm_runner(config, image_size, precision, batch,
                                                       compiled=True, device=device)
    if peers.get("keras-hub") is True:
        make["keras-hub"] = lambda: keras_hub_runner(config, image_size, precision, batch)
    return make


def peers_available(names) -> dict:
    """Per peer, True or why it cannot run."""
    available = {}
    for name in names:
        module = {"timm": "timm", "keras-hub": "keras_hub"}[name]
        try:
            __import__(module)
            available[name] = True
        except ImportError as err:
            available[name] = f"unavailable ({err})"
    return available
