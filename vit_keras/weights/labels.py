"""Class names for the heads of the named releases, and decode_predictions, which turns a
classifier's logits into its best class names as keras.applications does.

The names ship with the package (label_sets/, written by scripts/labels.py from timm's package
data, Apache-2.0): ImageNet-1k in the standard order (index 0 is n01440764, tench), and
ImageNet-21k in Google's order, which the 21,843-class heads of the paper's and AugReg's
pre-training use. Each class is a WordNet synset id and its lemmas ("tench, Tinca tinca").
"""

from __future__ import annotations

import functools
import importlib.resources

import keras
import numpy as np

from vit_keras import configs, preprocessing
from vit_keras.weights import pretrained

# A head's count of classes -> the shipped label set that names them.
LABEL_SETS = {1000: "imagenet1k", 21843: "imagenet21k"}
# The width of the clip_* releases' head: the projection into CLIP's image-text space.
CLIP_WIDTH = 512


@functools.cache
def class_names(label_set: str) -> tuple[tuple[str, str], ...]:
    """The classes of a shipped label set, in its heads' order.

    Args:
        label_set: a value of LABEL_SETS, "imagenet1k" or "imagenet21k".

    Returns:
        One (synset id, name) pair per class, e.g. ("n01440764", "tench, Tinca tinca").

    Raises:
        ValueError: `label_set` is not one that ships with the package.
    """
    if label_set not in LABEL_SETS.values():
        raise ValueError(f"unknown label set {label_set!r}: expected one of "
                         f"{', '.join(LABEL_SETS.values())}")
    text = importlib.resources.files("vit_keras.weights") / "label_sets" / f"{label_set}.txt"
    lines = text.read_text(encoding="utf-8").splitlines()
    return tuple(tuple(line.split("\t", 1)) for line in lines if not line.startswith("#"))


def release_label_set(release: str) -> str:
    """The label set that names the classes of a release's head, refusing a release whose
    head puts out no class scores (CLIP's projection, or no head at all).

    Args:
        release: a named release of vit_keras.weights.pretrained, e.g. "augreg_in21k_ft_in1k".

    Returns:
        "imagenet1k" or "imagenet21k".

    Raises:
        ValueError: `release` is not a named release, its output is not class scores, or no
            shipped label set has its count of classes.
    """
    classes = pretrained.release(release).num_classes
    if classes == 0:
        raise ValueError(f"release {release!r} has no head (its models are built with "
                         "include_top=False): its output is features, not class scores")
    if classes == CLIP_WIDTH:
        raise ValueError(f"release {release!r} is CLIP's image-text projection, not class "
                         "scores: compare its output with text embeddings instead")
    return _label_set_of_count(classes)


def decode_predictions(logits, top: int = 5, model: keras.Model | None = None) -> list:
    """The `top` most probable classes of each image, as
    keras.applications.imagenet_utils.decode_predictions gives them, from a classifier's logits.

    The label set is the one of the release the model's weights came from, where `model` is
    given and its release is known (vit_keras.preprocessing.release_of); otherwise it follows
    the count of classes: 1,000 is ImageNet-1k, 21,843 Google's ImageNet-21k order. An output
    that is not a classifier's is refused by name, since names put on it would be made up.

    Args:
        logits: (batch, classes) scores before the softmax, a NumPy array or a backend tensor
            (what `model.predict` returns).
        top: how many classes to return per image, the most probable first.
        model: the vk.vit model that made the logits, to take the label set from its release
            and to refuse a headless model's output.

    Returns:
        One list per image of (synset id, name, probability) tuples, best first; the
        probabilities are the softmax of the logits, as Python floats.

    Raises:
        ValueError: `logits` is not (batch, classes); `top` is not a positive int; `model` has
            no head (include_top=False), or its release's output is CLIP's projection, or
            its head is not its release's (a head of its own, e.g. fine-tuned); or no shipped
            label set has the logits' count of classes.
    """
    logits = np.asarray(keras.ops.convert_to_numpy(logits), dtype="float64")
    if logits.ndim != 2:
        raise ValueError("decode_predictions takes logits of shape (batch, classes), got shape "
                         f"{logits.shape}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive int, got {top!r}")
    names = class_names(_label_set(logits.shape[-1], model))
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=-1, keepdims=True)
    best = np.argsort(-probabilities, axis=-1, kind="stable")[:, :top]
    return [[(*names[i], float(row[i])) for i in order]
            for row, order in zip(probabilities, best, strict=True)]


def _label_set(classes: int, model: keras.Model | None) -> str:
    """The label set of `classes`-wide logits made by `model` (None: unknown)."""
    if model is None:
        return _label_set_of_count(classes)
    if not any(layer.name == configs.HEAD for layer in model.layers):
        raise ValueError(f"model {model.name!r} has no head (built with include_top=False): "
                         "its output is the pooled features, not class scores")
    release = preprocessing.release_of(model)
    if release is None:
        return _label_set_of_count(classes)
    head = pretrained.release(release).num_classes
    if classes != head:
        raise ValueError(
            f"the logits have {classes} classes but the {release!r} release's head has "
            f"{head}: the model's head is its own (fine-tuned), whose "
            "names are its training's; decode_predictions(logits) without model= goes by the "
            "count of classes")
    return release_label_set(release)


def _label_set_of_count(classes: int) -> str:
    if classes not in LABEL_SETS:
        known = ", ".join(f"{count} ({name})" for count, name in LABEL_SETS.items())
        raise ValueError(f"no label set has {classes} classes: decode_predictions knows "
                         f"{known}")
    return LABEL_SETS[classes]

