"""Official pre-trained checkpoints by name, fetched once into the Keras cache.

The files are Google's public vit_jax / AugReg releases. VIT_KERAS_WEIGHTS_URL replaces the
base address (a mirror, or a local server in tests).
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse

import keras

BASE_URL = "https://storage.googleapis.com/vit_models/"
_AUGREG = "augreg/{}-i21k-300ep-lr_0.001-aug_{}-{}"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    path: str  # relative to the base address
    resolution: int
    num_classes: int


def _original(variant: str) -> str:
    """'B/16' -> 'ViT-B_16', 'R50+B/16' -> 'R50+ViT-B_16': the paper's file names."""
    resnet, plus, vit = variant.rpartition("+")
    return f"{resnet}{plus}ViT-{vit.replace('/', '_')}"


def _augreg(model: str, aug_wd: str, finetune: str = "", do_sd: str = "do_0.0-sd_0.0") -> str:
    return _AUGREG.format(model, aug_wd, do_sd) + finetune + ".npz"


_IN1K_224 = "--imagenet2012-steps_20k-lr_{}-res_224"

# name -> {variant: checkpoint}; "what it was trained on" is in README's table.
PRETRAINED: dict[str, dict[str, Checkpoint]] = {
    # "How to train your ViT" (AugReg) recommended ImageNet-21k models (big_vision's list).
    "augreg_in21k": {
        "Ti/16": Checkpoint(_augreg("Ti_16", "none-wd_0.03"), 224, 21843),
        "S/32": Checkpoint(_augreg("S_32", "none-wd_0.1"), 224, 21843),
        "S/16": Checkpoint(_augreg("S_16", "light1-wd_0.03"), 224, 21843),
        "B/32": Checkpoint(_augreg("B_32", "light1-wd_0.1"), 224, 21843),
        "B/16": Checkpoint(_augreg("B_16", "medium1-wd_0.1"), 224, 21843),
        "B/8": Checkpoint(_augreg("B_8", "medium2-wd_0.1"), 224, 21843),
        "L/16": Checkpoint(_augreg("L_16", "strong1-wd_0.1"), 224, 21843),
        "R+Ti/16": Checkpoint(_augreg("R_Ti_16", "none-wd_0.03"), 224, 21843),
        "R26+S/32": Checkpoint(_augreg("R26_S_32", "light1-wd_0.1"), 224, 21843),
        "R50+L/32": Checkpoint(_augreg("R50_L_32", "medium1-wd_0.1", do_sd="do_0.1-sd_0.1"), 224,
                               21843),
    },
    # The same pre-training, fine-tuned on ImageNet-1k at 224 (timm's augreg_in21k_ft_in1k).
    "augreg_in21k_ft_in1k": {
        "Ti/16": Checkpoint(_augreg("Ti_16", "none-wd_0.03", _IN1K_224.format("0.03")), 224, 1000),
        "S/16": Checkpoint(_augreg("S_16", "light1-wd_0.03", _IN1K_224.format("0.03")), 224,
                           1000),
        "B/16": Checkpoint(_augreg("B_16", "medium1-wd_0.1", _IN1K_224.format("0.01")), 224,
                           1000),
    },
    # The paper's original ImageNet-21k pre-training, with its representation layer.
    "imagenet21k": {
        v: Checkpoint(f"imagenet21k/{_original(v)}.npz", 224, 21843)
        for v in ("B/16", "B/32", "L/16", "L/32", "H/14", "R50+B/16")
    },
    # The paper's ImageNet-21k models fine-tuned on ImageNet-1k at 384 px.
    "imagenet21k_ft_in1k": {
        v: Checkpoint(f"imagenet21k+imagenet2012/{_original(v)}.npz", 384, 1000)
        for v in ("B/16", "B/32", "L/16", "L/32", "R50+B/16")
    },
}


DESCRIPTIONS = {
    "augreg_in21k": "ImageNet-21k, AugReg recipe (Steiner et al. 2021), 300 epochs; "
                    "the recommended 'How to train your ViT' models",
    "augreg_in21k_ft_in1k": "augreg_in21k fine-tuned on ImageNet-1k, 20k steps",
    "imagenet21k": "ImageNet-21k, the paper's original pre-training (with pre_logits)",
    "imagenet21k_ft_in1k": "imagenet21k fine-tuned on ImageNet-1k (the paper's Table 2 models)",
}


def names() -> list[str]:
    return sorted(PRETRAINED)


def is_name(weights) -> bool:
    return isinstance(weights, str) and weights in PRETRAINED


def checkpoint(variant, name: str) -> Checkpoint:
    available = PRETRAINED[name]
    if variant not in available:
        raise ValueError(f"no {name!r} checkpoint for variant {variant!r}: it exists for "
                         f"{', '.join(available)}")
    return available[variant]


def url(entry: Checkpoint) -> str:
    base = os.environ.get("VIT_KERAS_WEIGHTS_URL", BASE_URL)
    return base.rstrip("/") + "/" + urllib.parse.quote(entry.path)


def resolve(weights, variant) -> str:
    """A local path for `weights`: a pre-trained name is fetched for `variant`, anything else
    is returned as given."""
    return fetch(variant, weights) if is_name(weights) else weights


def fetch(variant, name: str) -> str:
    """Local path of the named checkpoint, downloading it once into $KERAS_HOME/models."""
    entry = checkpoint(variant, name)
    cache_dir = os.environ.get("KERAS_HOME")  # read now: Keras reads it once, at import
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)  # else get_file falls back to /tmp/.keras
    return keras.utils.get_file(fname=entry.path.replace("/", "__"), origin=url(entry),
                                cache_dir=cache_dir,
                                cache_subdir=os.path.join("models", "vit_keras"))
