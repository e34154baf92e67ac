"""Pre-trained checkpoints by name, fetched once into the Keras cache: one Release record per
family, saying where its files are, under what licence, and the vk.vit() options they need.

Google's vit_jax / AugReg .npz files, and the later families (DeiT, DeiT III, DINO, MAE,
DINOv2) as timm publishes them on the Hugging Face Hub. VIT_KERAS_WEIGHTS_URL replaces every
base address (a mirror holding both trees, or a local server in tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import urllib.error
import urllib.parse

import keras

BASE_URL = "https://storage.googleapis.com/vit_models/"
HUB_URL = "https://huggingface.co/"
_AUGREG = "augreg/{}-i21k-300ep-lr_0.001-aug_{}-{}"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    path: str  # relative to the base address
    resolution: int
    num_classes: int  # 0: the file has no head (build with include_top=False)
    base: str = BASE_URL
    architecture: str | None = None  # timm's model that runs the file, if not its own name

    @property
    def timm_model(self) -> str | None:
        """The timm model name ("deit3_small_patch16_224.fb_in1k") of a file timm publishes
        on the Hub, None for Google's files."""
        if self.base != HUB_URL:
            return None
        return self.architecture or self.path.split("/resolve/")[0].removeprefix("timm/")


@dataclasses.dataclass(frozen=True)
class Release:
    """A family of published checkpoints, one per variant."""

    description: str
    licence: str
    checkpoints: dict[str, Checkpoint]
    options: dict = dataclasses.field(default_factory=dict)  # the vk.vit() arguments they need

    @property
    def architecture(self) -> dict:
        """The options that shape the model, without include_top: what a model built for
        these files' architecture, with a head of its own, takes."""
        return {k: v for k, v in self.options.items() if k != "include_top"}


def _timm(hub_id: str, resolution: int = 224, num_classes: int = 1000,
          architecture: str | None = None) -> Checkpoint:
    """A timm file on the Hugging Face Hub, e.g. "timm/deit_base_patch16_224.fb_in1k"."""
    return Checkpoint(f"{hub_id}/resolve/main/model.safetensors", resolution, num_classes,
                      base=HUB_URL, architecture=architecture)


_EXACT = {"approximate_gelu": False}
_CLIP = {"pre_norm": True, "layer_norm_epsilon": 1e-5}
_SIZES = {"Ti": "tiny", "S": "small", "B": "base", "L": "large"}


def _original(variant: str) -> str:
    """'B/16' -> 'ViT-B_16', 'R50+B/16' -> 'R50+ViT-B_16': the paper's file names."""
    resnet, plus, vit = variant.rpartition("+")
    return f"{resnet}{plus}ViT-{vit.replace('/', '_')}"


def _augreg(model: str, aug_wd: str, finetune: str = "", do_sd: str = "do_0.0-sd_0.0") -> str:
    return _AUGREG.format(model, aug_wd, do_sd) + finetune + ".npz"


_IN1K_224 = "--imagenet2012-steps_20k-lr_{}-res_224"

# The AugReg and paper releases' recipes are in README's table; the later families' in
# docs/weights.md.
PRETRAINED: dict[str, Release] = {
    "augreg_in21k": Release(
        "ImageNet-21k, AugReg recipe (Steiner et al. 2021), 300 epochs; the recommended "
        "'How to train your ViT' models", "Apache-2.0", {
            "Ti/16": Checkpoint(_augreg("Ti_16", "none-wd_0.03"), 224, 21843),
            "S/32": Checkpoint(_augreg("S_32", "none-wd_0.1"), 224, 21843),
            "S/16": Checkpoint(_augreg("S_16", "light1-wd_0.03"), 224, 21843),
            "B/32": Checkpoint(_augreg("B_32", "light1-wd_0.1"), 224, 21843),
            "B/16": Checkpoint(_augreg("B_16", "medium1-wd_0.1"), 224, 21843),
            "B/8": Checkpoint(_augreg("B_8", "medium2-wd_0.1"), 224, 21843),
            "L/16": Checkpoint(_augreg("L_16", "strong1-wd_0.1"), 224, 21843),
            "R+Ti/16": Checkpoint(_augreg("R_Ti_16", "none-wd_0.03"), 224, 21843),
            "R26+S/32": Checkpoint(_augreg("R26_S_32", "light1-wd_0.1"), 224, 21843),
            "R50+L/32": Checkpoint(_augreg("R50_L_32", "medium1-wd_0.1",
                                           do_sd="do_0.1-sd_0.1"), 224, 21843),
        }),
    # The same pre-training, fine-tuned on ImageNet-1k at 224 (timm's augreg_in21k_ft_in1k).
    "augreg_in21k_ft_in1k": Release(
        "augreg_in21k fine-tuned on ImageNet-1k, 20k steps", "Apache-2.0", {
            "Ti/16": Checkpoint(_augreg("Ti_16", "none-wd_0.03", _IN1K_224.format("0.03")), 224,
                                1000),
            "S/16": Checkpoint(_augreg("S_16", "light1-wd_0.03", _IN1K_224.format("0.03")), 224,
                               1000),
            "B/16": Checkpoint(_augreg("B_16", "medium1-wd_0.1", _IN1K_224.format("0.01")), 224,
                               1000),
        }),
    "imagenet21k": Release(
        "ImageNet-21k, the paper's original pre-training (with pre_logits)",
        "Apache-2.0", {v: Checkpoint(f"imagenet21k/{_original(v)}.npz", 224, 21843)
                       for v in ("B/16", "B/32", "L/16", "L/32", "H/14", "R50+B/16")}),
    "imagenet21k_ft_in1k": Release(
        "imagenet21k fine-tuned on ImageNet-1k (the paper's Table 2 models)",
        "Apache-2.0",
        {v: Checkpoint(f"imagenet21k+imagenet2012/{_original(v)}.npz", 384, 1000)
         for v in ("B/16", "B/32", "L/16", "L/32", "R50+B/16")}),
    "deit_in1k": Release(
        "DeiT (Touvron et al. 2021): ImageNet-1k only, the DeiT recipe without the "
        "distillation token", "Apache-2.0",
        {v: _timm(f"timm/deit_{size}_patch16_224.fb_in1k")
         for v, size in (("Ti/16", "tiny"), ("S/16", "small"), ("B/16", "base"))},
        _EXACT),
    "deit3_in1k": Release(
        "DeiT III (Touvron et al. 2022): ImageNet-1k, with LayerScale", "Apache-2.0",
        {v: _timm(f"timm/deit3_{size}_patch16_224.fb_in1k")
         for v, size in (("S/16", "small"), ("B/16", "base"), ("L/16", "large"))},
        {**_EXACT, "layer_scale": 1e-6}),
    "deit3_in21k_ft_in1k": Release(
        "DeiT III: ImageNet-21k, fine-tuned on ImageNet-1k", "Apache-2.0",
        {v: _timm(f"timm/deit3_{size}_patch16_224.fb_in22k_ft_in1k")
         for v, size in (("S/16", "small"), ("B/16", "base"), ("L/16", "large"))},
        {**_EXACT, "layer_scale": 1e-6}),
    "dino": Release(
        "DINO (Caron et al. 2021): self-supervised on ImageNet-1k, no head (features)",
        "Apache-2.0",
        {v: _timm(f"timm/vit_{size}_patch{patch}_224.dino", num_classes=0)
         for v, size, patch in (("S/16", "small", 16), ("S/8", "small", 8),
                                ("B/16", "base", 16), ("B/8", "base", 8))},
        {**_EXACT, "include_top": False}),
    "mae": Release(
        "MAE (He et al. 2022): masked-autoencoder pre-training on ImageNet-1k, the encoder "
        "without a head (features)", "CC-BY-NC-4.0 (non-commercial)",
        {"B/16": _timm("timm/vit_base_patch16_224.mae", num_classes=0),
         "L/16": _timm("timm/vit_large_patch16_224.mae", num_classes=0),
         "H/14": _timm("timm/vit_huge_patch14_224.mae", num_classes=0)},
        {**_EXACT, "include_top": False}),
    "dinov2": Release(
        "DINOv2 (Oquab et al. 2023): self-supervised on LVD-142M, with LayerScale, 518 px, no "
        "head (features)", "Apache-2.0",
        {v: _timm(f"timm/vit_{size}_patch14_dinov2.lvd142m", 518, 0)
         for v, size in (("S/14", "small"), ("B/14", "base"), ("L/14", "large"))},
        {**_EXACT, "layer_scale": 1e-5, "include_top": False}),
    "dinov2_reg": Release(
        "DINOv2 with registers (Darcet et al. 2024): four register tokens, otherwise as "
        "dinov2", "Apache-2.0",
        {f"{v}/14": _timm(f"timm/vit_{_SIZES[v]}_patch14_reg4_dinov2.lvd142m", 518, 0)
         for v in ("S", "B", "L")},
        {**_EXACT, "layer_scale": 1e-5, "num_register_tokens": 4, "include_top": False}),
    "deit_distilled_in1k": Release(
        "DeiT distilled from a RegNetY-16GF teacher: ImageNet-1k, class and distillation "
        "tokens, the two heads' mean", "Apache-2.0",
        {f"{v}/16": _timm(f"timm/deit_{_SIZES[v]}_distilled_patch16_224.fb_in1k")
         for v in ("Ti", "S", "B")},
        {**_EXACT, "distilled": True}),
    # OpenAI's weights run with QuickGELU, which timm builds as the _quickgelu variant.
    "clip_openai": Release(
        "CLIP image tower (Radford et al. 2021), OpenAI's WIT-400M weights; the head is the "
        "projection into the 512-wide image-text space", "MIT",
        {"B/16": _timm("timm/vit_base_patch16_clip_224.openai", num_classes=512,
                       architecture="vit_base_patch16_clip_quickgelu_224.openai"),
         "B/32": _timm("timm/vit_base_patch32_clip_224.openai", num_classes=512,
                       architecture="vit_base_patch32_clip_quickgelu_224.openai")},
        {**_EXACT, **_CLIP, "mlp_activation": "quick_gelu"}),
    "clip_laion2b": Release(
        "CLIP image tower trained by OpenCLIP on LAION-2B; the head is the projection into "
        "the 512-wide image-text space", "MIT",
        {"B/16": _timm("timm/vit_base_patch16_clip_224.laion2b", num_classes=512),
         "B/32": _timm("timm/vit_base_patch32_clip_224.laion2b", num_classes=512)},
        {**_EXACT, **_CLIP}),
}


def names() -> list[str]:
    return sorted(PRETRAINED)


def is_name(weights) -> bool:
    return isinstance(weights, str) and weights in PRETRAINED


def checkpoint(variant, name: str) -> Checkpoint:
    available = PRETRAINED[name].checkpoints
    if variant not in available:
        raise ValueError(f"no {name!r} checkpoint for variant {variant!r}: it exists for "
                         f"{', '.join(available)}")
    return available[variant]


def url(entry: Checkpoint) -> str:
    base = os.environ.get("VIT_KERAS_WEIGHTS_URL", entry.base)
    return base.rstrip("/") + "/" + urllib.parse.quote(entry.path)


def resolve(weights, variant) -> str:
    """A local path for `weights`: a pre-trained name is fetched for `variant`, anything else
    is returned as given."""
    return fetch(variant, weights) if is_name(weights) else weights


def cache_path(entry: Checkpoint) -> str:
    """Where fetch keeps `entry`'s file: $KERAS_HOME/models/vit_keras/ (KERAS_HOME defaults to
    ~/.keras; /tmp/.keras where that is not writable, as keras.utils.get_file chooses). A file
    placed there by hand is used without any download."""
    home = os.path.expanduser(os.environ.get("KERAS_HOME") or os.path.join("~", ".keras"))
    with contextlib.suppress(OSError):
        os.makedirs(home, exist_ok=True)
    if not os.access(home, os.W_OK):
        home = os.path.join("/tmp", ".keras")
    return os.path.join(home, "models", "vit_keras", entry.path.replace("/", "__"))


def fetch(variant, name: str) -> str:
    """Local path of the named checkpoint, downloading it once into the cache (cache_path).
    A failed download is one ValueError naming the address, the cache path and the mirror
    setting, instead of Keras' chain of wrapped URL errors."""
    entry = checkpoint(variant, name)
    path = cache_path(entry)
    folder, file_name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    try:
        return keras.utils.get_file(fname=file_name, origin=url(entry), cache_dir=folder,
                                    cache_subdir="")
    except Exception as err:  # Keras re-raises every failed download as a bare Exception
        raise ValueError(
            f"could not download the {name!r} weights for {variant} from {url(entry)} "
            f"({_reason(err)}); without network, place that file at {path}, or set "
            "VIT_KERAS_WEIGHTS_URL to a mirror that holds it under the same path") from None


def _reason(err: Exception) -> str:
    """What failed underneath Keras' "URL fetch failure" wrapper."""
    cause = err.__context__
    if isinstance(cause, urllib.error.HTTPError):
        return f"HTTP {cause.code} {cause.msg}"
    if isinstance(cause, urllib.error.URLError):
        return str(cause.reason)
    return str(err)
