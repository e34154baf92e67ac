"""Pre-trained checkpoints by name, fetched once into the Keras cache: one Release record per
family, saying where its files are, under what licence, the vk.vit() options they need, the
input convention they were trained with, and the model card (training data, the ImageNet-1k
top-1 their publisher reports, with its source) that docs/pretrained.md renders.

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

from vit_keras.preprocessing import IMAGENET, OPENAI_CLIP, UNIT_RANGE, InputConvention

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
class Top1:
    """ImageNet-1k top-1 accuracy (%) per variant as a source reports it, and how it was
    measured: a release without an ImageNet-1k head has a linear probe, a zero-shot score or
    a fine-tuned model's figure instead, which `measure` names.

    Attributes:
        measure: how: "head" (the file's own classifier), "linear probe", "zero-shot", ...
        source: who reports it, as a Markdown link to the table.
        values: {variant: top-1 in percent}; a variant the source has no figure for is absent.
    """

    measure: str
    source: str
    values: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Release:
    """A family of published checkpoints, one per variant, with its model card.

    Attributes:
        description: what the weights are.
        licence: the weights' licence (SPDX name).
        checkpoints: {variant: Checkpoint}.
        options: the vk.vit() arguments the files need.
        data: what they were trained on.
        convention: the input normalisation they were trained with; a model built from them
            records it (vit_keras.preprocessing).
        top1: the ImageNet-1k top-1 the publisher reports, or None where it reports none for
            these files (why is said in `description`).
    """

    description: str
    licence: str
    checkpoints: dict[str, Checkpoint]
    options: dict = dataclasses.field(default_factory=dict)
    data: str = ""
    convention: InputConvention = UNIT_RANGE
    top1: Top1 | None = None

    @property
    def architecture(self) -> dict:
        """The options that shape the model, without include_top: what a model built for
        these files' architecture, with a head of its own, takes."""
        return {k: v for k, v in self.options.items() if k != "include_top"}

    @property
    def num_classes(self) -> int:
        """The count of classes of the release's head (0: no head); its files share one."""
        return next(iter(self.checkpoints.values())).num_classes


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

# Where each card's top-1 comes from: the publishers' own tables, and where a publisher gives
# none for the very files, timm's evaluation of them.
_GOOGLE = ("[vision_transformer README](https://github.com/google-research/vision_transformer"
           "#available-vit-models)")
_TIMM = ("[timm results-imagenet.csv](https://github.com/huggingface/pytorch-image-models/blob/"
         "main/results/results-imagenet.csv)")
_DEIT = "[DeiT README](https://github.com/facebookresearch/deit/blob/main/README_deit.md)"
_DEIT3 = "[DeiT III README](https://github.com/facebookresearch/deit/blob/main/README_revenge.md)"
_DINO = "[DINO README](https://github.com/facebookresearch/dino#pretrained-models)"
_MAE = ("[MAE FINETUNE.md](https://github.com/facebookresearch/mae/blob/main/FINETUNE.md"
        "#linear-probing)")
_DINOV2 = "[DINOv2 README](https://github.com/facebookresearch/dinov2#pretrained-models)"
_OPENCLIP = ("[OpenCLIP openclip_results.csv](https://github.com/mlfoundations/open_clip/blob/main/"
             "docs/openclip_results.csv)")
_IN21K, _IN21K_IN1K, _IN1K = "ImageNet-21k", "ImageNet-21k, then ImageNet-1k", "ImageNet-1k"

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
        }, data=_IN21K,
        top1=Top1("these files fine-tuned on ImageNet-1k at 384 px", _GOOGLE, {
            "Ti/16": 78.22, "S/32": 79.58, "S/16": 83.73, "B/32": 83.59, "B/16": 85.49,
            "L/16": 85.59, "R+Ti/16": 75.40, "R26+S/32": 83.85, "R50+L/32": 85.99})),
    # The same pre-training, fine-tuned on ImageNet-1k at 224 (timm's augreg_in21k_ft_in1k).
    "augreg_in21k_ft_in1k": Release(
        "augreg_in21k fine-tuned on ImageNet-1k, 20k steps", "Apache-2.0", {
            "Ti/16": Checkpoint(_augreg("Ti_16", "none-wd_0.03", _IN1K_224.format("0.03")), 224,
                                1000),
            "S/16": Checkpoint(_augreg("S_16", "light1-wd_0.03", _IN1K_224.format("0.03")), 224,
                               1000),
            "B/16": Checkpoint(_augreg("B_16", "medium1-wd_0.1", _IN1K_224.format("0.01")), 224,
                               1000),
        }, data=_IN21K_IN1K,
        top1=Top1("head, timm's evaluation", _TIMM, {"Ti/16": 75.5, "S/16": 81.4, "B/16": 84.5})),
    "imagenet21k": Release(
        "ImageNet-21k, the paper's original pre-training (with pre_logits); no ImageNet-1k "
        "figure for these files (imagenet21k_ft_in1k is their fine-tune)",
        "Apache-2.0", {v: Checkpoint(f"imagenet21k/{_original(v)}.npz", 224, 21843)
                       for v in ("B/16", "B/32", "L/16", "L/32", "H/14", "R50+B/16")},
        data=_IN21K),
    "imagenet21k_ft_in1k": Release(
        "imagenet21k fine-tuned on ImageNet-1k (the paper's Table 2 models)",
        "Apache-2.0",
        {v: Checkpoint(f"imagenet21k+imagenet2012/{_original(v)}.npz", 384, 1000)
         for v in ("B/16", "B/32", "L/16", "L/32", "R50+B/16")},
        data=_IN21K_IN1K,
        top1=Top1("head, timm's evaluation", _TIMM,
                  {"B/16": 84.2, "L/32": 81.5, "R50+B/16": 85.0})),
    "deit_in1k": Release(
        "DeiT (Touvron et al. 2021): ImageNet-1k only, the DeiT recipe without the "
        "distillation token", "Apache-2.0",
        {v: _timm(f"timm/deit_{size}_patch16_224.fb_in1k")
         for v, size in (("Ti/16", "tiny"), ("S/16", "small"), ("B/16", "base"))},
        _EXACT, data=_IN1K, convention=IMAGENET,
        top1=Top1("head", _DEIT, {"Ti/16": 72.2, "S/16": 79.9, "B/16": 81.8})),
    "deit3_in1k": Release(
        "DeiT III (Touvron et al. 2022): ImageNet-1k, with LayerScale", "Apache-2.0",
        {v: _timm(f"timm/deit3_{size}_patch16_224.fb_in1k")
         for v, size in (("S/16", "small"), ("B/16", "base"), ("L/16", "large"))},
        {**_EXACT, "layer_scale": 1e-6}, data=_IN1K, convention=IMAGENET,
        top1=Top1("head", _DEIT3, {"S/16": 81.4, "B/16": 83.8, "L/16": 84.9})),
    "deit3_in21k_ft_in1k": Release(
        "DeiT III: ImageNet-21k, fine-tuned on ImageNet-1k", "Apache-2.0",
        {v: _timm(f"timm/deit3_{size}_patch16_224.fb_in22k_ft_in1k")
         for v, size in (("S/16", "small"), ("B/16", "base"), ("L/16", "large"))},
        {**_EXACT, "layer_scale": 1e-6}, data=_IN21K_IN1K, convention=IMAGENET,
        top1=Top1("head", _DEIT3, {"S/16": 83.1, "B/16": 85.7, "L/16": 87.0})),
    "dino": Release(
        "DINO (Caron et al. 2021): self-supervised on ImageNet-1k, no head (features)",
        "Apache-2.0",
        {v: _timm(f"timm/vit_{size}_patch{patch}_224.dino", num_classes=0)
         for v, size, patch in (("S/16", "small", 16), ("S/8", "small", 8),
                                ("B/16", "base", 16), ("B/8", "base", 8))},
        {**_EXACT, "include_top": False}, data="ImageNet-1k images, no labels",
        convention=IMAGENET,
        top1=Top1("linear probe", _DINO, {"S/16": 77.0, "S/8": 79.7, "B/16": 78.2, "B/8": 80.1})),
    "mae": Release(
        "MAE (He et al. 2022): masked-autoencoder pre-training on ImageNet-1k, the encoder "
        "without a head (features)", "CC-BY-NC-4.0 (non-commercial)",
        {"B/16": _timm("timm/vit_base_patch16_224.mae", num_classes=0),
         "L/16": _timm("timm/vit_large_patch16_224.mae", num_classes=0),
         "H/14": _timm("timm/vit_huge_patch14_224.mae", num_classes=0)},
        {**_EXACT, "include_top": False}, data="ImageNet-1k images, no labels",
        convention=IMAGENET,
        top1=Top1("linear probe (PyTorch)", _MAE, {"B/16": 67.8, "L/16": 76.0, "H/14": 77.2})),
    "dinov2": Release(
        "DINOv2 (Oquab et al. 2023): self-supervised on LVD-142M, with LayerScale, 518 px, no "
        "head (features)", "Apache-2.0",
        {v: _timm(f"timm/vit_{size}_patch14_dinov2.lvd142m", 518, 0)
         for v, size in (("S/14", "small"), ("B/14", "base"), ("L/14", "large"))},
        {**_EXACT, "layer_scale": 1e-5, "include_top": False},
        data="LVD-142M images, no labels", convention=IMAGENET,
        top1=Top1("linear probe", _DINOV2, {"S/14": 81.1, "B/14": 84.5, "L/14": 86.3})),
    "dinov2_reg": Release(
        "DINOv2 with registers (Darcet et al. 2024): four register tokens, otherwise as "
        "dinov2", "Apache-2.0",
        {f"{v}/14": _timm(f"timm/vit_{_SIZES[v]}_patch14_reg4_dinov2.lvd142m", 518, 0)
         for v in ("S", "B", "L")},
        {**_EXACT, "layer_scale": 1e-5, "num_register_tokens": 4, "include_top": False},
        data="LVD-142M images, no labels", convention=IMAGENET,
        top1=Top1("linear probe", _DINOV2, {"S/14": 80.9, "B/14": 84.6, "L/14": 86.7})),
    "deit_distilled_in1k": Release(
        "DeiT distilled from a RegNetY-16GF teacher: ImageNet-1k, class and distillation "
        "tokens, the two heads' mean", "Apache-2.0",
        {f"{v}/16": _timm(f"timm/deit_{_SIZES[v]}_distilled_patch16_224.fb_in1k")
         for v in ("Ti", "S", "B")},
        {**_EXACT, "distilled": True}, data=_IN1K, convention=IMAGENET,
        top1=Top1("heads", _DEIT, {"Ti/16": 74.5, "S/16": 81.2, "B/16": 83.4})),
    # OpenAI's weights run with QuickGELU, which timm builds as the _quickgelu variant.
    "clip_openai": Release(
        "CLIP image tower (Radford et al. 2021), OpenAI's WIT-400M weights; the head is the "
        "projection into the 512-wide image-text space", "MIT",
        {"B/16": _timm("timm/vit_base_patch16_clip_224.openai", num_classes=512,
                       architecture="vit_base_patch16_clip_quickgelu_224.openai"),
         "B/32": _timm("timm/vit_base_patch32_clip_224.openai", num_classes=512,
                       architecture="vit_base_patch32_clip_quickgelu_224.openai")},
        {**_EXACT, **_CLIP, "mlp_activation": "quick_gelu"},
        data="WIT-400M image-text pairs", convention=OPENAI_CLIP,
        top1=Top1("zero-shot, OpenCLIP's evaluation", _OPENCLIP, {"B/16": 68.3, "B/32": 63.3})),
    "clip_laion2b": Release(
        "CLIP image tower trained by OpenCLIP on LAION-2B; the head is the projection into "
        "the 512-wide image-text space", "MIT",
        {"B/16": _timm("timm/vit_base_patch16_clip_224.laion2b", num_classes=512),
         "B/32": _timm("timm/vit_base_patch32_clip_224.laion2b", num_classes=512)},
        {**_EXACT, **_CLIP}, data="LAION-2B image-text pairs", convention=OPENAI_CLIP,
        top1=Top1("zero-shot", _OPENCLIP, {"B/16": 70.2, "B/32": 66.6})),
}


def names() -> list[str]:
    return sorted(PRETRAINED)


def is_name(weights) -> bool:
    return isinstance(weights, str) and weights in PRETRAINED


def release(name: str) -> Release:
    """The named release; a ValueError listing the names for any other."""
    if not is_name(name):
        raise ValueError(f"no release named {name!r}: expected one of {', '.join(names())}")
    return PRETRAINED[name]


def vit_kwargs(name: str, variant) -> dict:
    """The vk.vit() keywords of the model that `name`'s file for `variant` was trained as:
    its image size, its head and the release's options."""
    entry = checkpoint(variant, name)
    return {"image_size": entry.resolution, "num_classes": entry.num_classes,
            **PRETRAINED[name].options}


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
