"""vit-keras predict with a pre-trained release name in place of a model file, against a random
checkpoint in the release's layout served from a loopback address."""

from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

import vit_keras as vk
from apps import predict
from tests.conftest import randomize, timm_classes
from vit_keras.weights import pretrained

PHOTO = Path(__file__).parent / "data" / "photo.jpg"
RELEASE = "augreg_in21k_ft_in1k"


def test_a_release_name_prints_imagenet_names_of_the_top_logits(weights_server, capsys):  # noqa: F811
    root, requests = weights_server
    entry = pretrained.checkpoint("Ti/16", RELEASE)
    source = randomize(vk.vit("Ti/16", num_classes=entry.num_classes), scale=0.02)
    (root / entry.path).parent.mkdir(parents=True)
    vk.save_npz(source, root / entry.path)

    results = predict.main([RELEASE, "--variant", "Ti/16", str(PHOTO), "--top-k", "3"])

    # Google's AugReg models take pixels scaled to [-1, 1]
    with Image.open(PHOTO) as image:
        pixels = np.asarray(image.convert("RGB").resize((224, 224), Image.BILINEAR), "float32")
    logits = keras.ops.convert_to_numpy(source(pixels[None] / 127.5 - 1))[0].astype("float64")
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    names = timm_classes("imagenet_synsets.txt")
    best = np.argsort(probabilities)[::-1][:3]
    assert [(synset, name) for synset, name, _ in results[0]] == [names[i] for i in best]
    np.testing.assert_allclose([p for *_, p in results[0]], probabilities[best], atol=1e-5)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-4:] == [f"{PHOTO}:"] + [f"  {probabilities[i]:.1%} {names[i][1]} "
                                            f"({names[i][0]})" for i in best]
    assert requests == ["/" + entry.path]


def test_what_is_not_a_release_or_its_variant_is_refused(weights_server, tmp_path,  # noqa: F811
                                                          monkeypatch):
    _, requests = weights_server
    with pytest.raises(FileNotFoundError, match="model 'augreg' does not exist, nor is it a "
                                                "pre-trained release name \\(augreg_in21k, "):
        predict.main(["augreg", str(PHOTO)])
    with pytest.raises(ValueError, match=f"'{RELEASE}' is a pre-trained release: give "
                                         "--variant, one of Ti/16, S/16, B/16"):
        predict.main([RELEASE, str(PHOTO)])
    with pytest.raises(ValueError, match=f"no '{RELEASE}' checkpoint for variant 'L/16'"):
        predict.main([RELEASE, "--variant", "L/16", str(PHOTO)])
    with pytest.raises(ValueError, match="release 'clip_openai' is CLIP's image-text "
                                         "projection, not class scores"):
        predict.main(["clip_openai", "--variant", "B/16", str(PHOTO)])
    with pytest.raises(ValueError, match="release 'dino' has no head"):
        predict.main(["dino", "--variant", "S/16", str(PHOTO)])
    # an existing file of a release's name is the model, whatever it holds
    monkeypatch.chdir(tmp_path)
    Path(RELEASE).write_text("not a model")
    with pytest.raises(ValueError, match=f"'{RELEASE}': expected a .keras, SavedModel folder"):
        predict.main([RELEASE, str(PHOTO)])
    with pytest.raises(ValueError, match="--variant picks a pre-trained release's checkpoint"):
        predict.main([RELEASE, "--variant", "Ti/16", str(PHOTO)])
    assert requests == []  # nothing was downloaded


def test_help_says_a_path_wins(capsys):
    with pytest.raises(SystemExit):
        predict.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "vit-keras predict augreg_in21k_ft_in1k --variant B/16 photo.jpg" in text
    assert "an existing file or folder of that name wins over the release" in text
