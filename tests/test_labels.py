"""The shipped class names against timm's own data files, and decode_predictions against a
softmax and a sort in NumPy."""

from pathlib import Path

import keras
import numpy as np
import pytest

import vit_keras as vk
from tests.conftest import TINY, timm_classes
from vit_keras import preprocessing
from vit_keras.weights import labels, pretrained

ROOT = Path(__file__).parents[1]


# The label sets' class order as timm's package data lists it.
TIMM_SYNSETS = {"imagenet1k": "imagenet_synsets.txt", "imagenet21k": "imagenet21k_goog_synsets.txt"}


@pytest.mark.parametrize("label_set, count", [("imagenet1k", 1000), ("imagenet21k", 21843)])
def test_shipped_names_are_timms(label_set, count):
    shipped = labels.class_names(label_set)
    assert len(shipped) == count
    assert list(shipped) == timm_classes(TIMM_SYNSETS[label_set])


def test_known_classes():
    in1k, in21k = labels.class_names("imagenet1k"), labels.class_names("imagenet21k")
    assert in1k[0] == ("n01440764", "tench, Tinca tinca")
    assert in1k[1] == ("n01443537", "goldfish, Carassius auratus")
    # ILSVRC 2012's class order is its synset ids sorted
    assert [synset for synset, _ in in1k] == sorted(synset for synset, _ in in1k)
    assert len({synset for synset, _ in in21k}) == 21843
    # ImageNet-1k's classes are the 21k's, but for the teddy bear, which the fall 2011
    # release of the full ImageNet left out
    assert {synset for synset, _ in in1k} - {synset for synset, _ in in21k} == {"n04399382"}
    assert in21k[0] == ("n00004475", "organism, being")


def test_files_ship_with_the_package():
    import tomllib  # Python 3.11's

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["vit_keras.weights"]
    folder = ROOT / "vit_keras" / "weights"
    shipped = {path for pattern in patterns for path in folder.glob(pattern)}
    assert shipped == set((folder / "label_sets").iterdir())
    header = (folder / "label_sets" / "imagenet1k.txt").read_text().split("\nn0", 1)[0]
    assert "timm" in header and "Apache License 2.0" in header


def numpy_top(logits, top, label_set):
    """(synset, name, probability) of the `top` largest softmax values, in NumPy."""
    names = timm_classes(TIMM_SYNSETS[label_set])
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities = exp / exp.sum(-1, keepdims=True)
    return [[(*names[i], pytest.approx(float(row[i]), rel=1e-6))
             for i in np.argsort(row)[::-1][:top]] for row in probabilities]


@pytest.mark.parametrize("classes, label_set", [(1000, "imagenet1k"), (21843, "imagenet21k")])
def test_decode_predictions_matches_numpy(classes, label_set):
    logits = np.random.default_rng(classes).normal(0, 3, (3, classes)).astype("float32")
    assert vk.decode_predictions(logits, top=5) == numpy_top(logits, 5, label_set)
    tensor = keras.ops.convert_to_tensor(logits)  # what model(...) returns on the backend
    assert vk.decode_predictions(tensor, top=2) == numpy_top(logits, 2, label_set)


def test_decode_predictions_of_a_model_without_a_release():
    model = vk.vit(TINY, image_size=32, num_classes=1000)
    logits = np.random.default_rng(0).normal(0, 3, (1, 1000)).astype("float32")
    assert vk.decode_predictions(logits, top=3, model=model) == numpy_top(logits, 3,
                                                                         "imagenet1k")


@pytest.mark.parametrize("logits, top, message", [
    (np.zeros(1000), 5, r"logits of shape \(batch, classes\), got shape \(1000,\)"),
    (np.zeros((1, 1000)), 0, "top must be a positive int, got 0"),
    (np.zeros((1, 10)), 5, r"no label set has 10 classes: decode_predictions knows "
                           r"1000 \(imagenet1k\), 21843 \(imagenet21k\)")])
def test_decode_predictions_refuses_what_it_cannot_name(logits, top, message):
    with pytest.raises(ValueError, match=message):
        vk.decode_predictions(logits, top=top)


def test_a_headless_model_is_refused():
    model = vk.vit(TINY, image_size=32, include_top=False)
    with pytest.raises(ValueError, match="has no head \\(built with include_top=False\\): its "
                                         "output is the pooled features, not class scores"):
        vk.decode_predictions(np.zeros((1, 1000)), model=model)


def recorded(monkeypatch, release):
    """Models seem to come from `release`'s weights, whatever release_of reads."""
    monkeypatch.setattr(preprocessing, "release_of", lambda model: release)


@pytest.mark.parametrize("release, classes, label_set", [
    ("augreg_in21k_ft_in1k", 1000, "imagenet1k"), ("augreg_in21k", 21843, "imagenet21k"),
    ("deit_distilled_in1k", 1000, "imagenet1k"), ("imagenet21k", 21843, "imagenet21k")])
def test_the_release_names_the_label_set(monkeypatch, release, classes, label_set):
    recorded(monkeypatch, release)
    model = vk.vit(TINY, image_size=32, num_classes=classes)
    logits = np.random.default_rng(1).normal(0, 3, (2, classes))
    assert vk.decode_predictions(logits, model=model) == numpy_top(logits, 5, label_set)
    assert labels.release_label_set(release) == label_set


def test_clip_and_headless_releases_are_refused(monkeypatch):
    model = vk.vit(TINY, image_size=32, num_classes=512)
    for release in ("clip_openai", "clip_laion2b"):
        recorded(monkeypatch, release)
        with pytest.raises(ValueError, match=f"release '{release}' is CLIP's image-text "
                                             "projection, not class scores"):
            vk.decode_predictions(np.zeros((1, 512)), model=model)
    with pytest.raises(ValueError, match="release 'dino' has no head"):
        labels.release_label_set("dino")
    recorded(monkeypatch, "dino")  # a head of the user's own on DINO's features
    model = vk.vit(TINY, image_size=32, num_classes=1000)
    with pytest.raises(ValueError, match="the logits have 1000 classes but the 'dino' "
                                         "release's head has 0: the model's head is its own"):
        vk.decode_predictions(np.zeros((1, 1000)), model=model)


# What each release's head puts out, from its publisher's description: an ImageNet label set,
# or no class scores (CLIP's projection, features without a head).
HEADS = {"augreg_in21k": "imagenet21k", "augreg_in21k_ft_in1k": "imagenet1k",
         "imagenet21k": "imagenet21k", "imagenet21k_ft_in1k": "imagenet1k",
         "deit_in1k": "imagenet1k", "deit_distilled_in1k": "imagenet1k",
         "deit3_in1k": "imagenet1k", "deit3_in21k_ft_in1k": "imagenet1k",
         "clip_openai": "is CLIP", "clip_laion2b": "is CLIP", "dino": "has no head",
         "dinov2": "has no head", "dinov2_reg": "has no head", "mae": "has no head"}


def test_every_release_is_named_or_refused():
    assert set(HEADS) == set(pretrained.names())  # a new release is classified here too
    for release, head in HEADS.items():
        if head.startswith("imagenet"):
            assert labels.release_label_set(release) == head
        else:
            with pytest.raises(ValueError, match=f"release '{release}' {head}"):
                labels.release_label_set(release)
