"""A regression check of the committed Fashion-MNIST reference model: docs/mainjob/model.keras,
loaded in safe mode and run on the 10,000 Fashion-MNIST test images, still gets as many right
as docs/mainjob/result.json says it did when it was trained: at top-1 with each image's logits
averaged with its mirror's (the recipe's), at top-1 from its logits alone, and at top-5.

The expected counts are the code's own output (apps.train wrote result.json), so this pins
that loading and the forward pass have not changed, not that they are right: the NumPy and
timm references in test_models check the computation. The counts are recomputed here apart
from the code that wrote them: the images and labels read from the IDX files, preprocessed
and scored by NumPy (not vit_keras.data or vit_keras.evaluation)."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest

import vit_keras  # noqa: F401  (registers the layers the .keras file names)
from vit_keras.data import read_idx

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "docs" / "mainjob"
RESULT = json.loads((RUN / "result.json").read_text())
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def correct_on_test_split(model) -> tuple[int, int, int]:
    """How many of the 10,000 test images the model classifies right, (from its logits
    averaged with its mirror's, from its logits alone, among the top 5 of the averaged
    logits): the 28x28 images resized to the model's size as the pipeline does (bilinear,
    rounded back to whole pixel values), pixels to [-1, 1], gray repeated to the model's
    channels."""
    import tensorflow as tf

    images = read_idx(str(FASHION_MNIST / "t10k-images-idx3-ubyte.gz"))[..., None]
    labels = read_idx(str(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz"))
    size = model.input.shape[1:3]
    if tuple(size) != images.shape[1:3]:
        images = np.clip(np.round(tf.image.resize(images, size).numpy()), 0, 255)
    inputs = np.repeat(images.astype("float32") / 127.5 - 1.0, model.input.shape[-1], axis=-1)
    logits = model.predict(inputs, batch_size=2500, verbose=0)
    mirrored = model.predict(inputs[:, :, ::-1], batch_size=2500, verbose=0)
    top5 = np.argsort(-(logits + mirrored), axis=-1)[:, :5]
    return (int(np.sum(np.argmax(logits + mirrored, axis=-1) == labels)),
            int(np.sum(np.argmax(logits, axis=-1) == labels)),
            int(np.sum(np.any(top5 == labels[:, None], axis=-1))))


# the backend that scored it: another's float rounding may move a borderline image
@pytest.mark.skipif(keras.backend.backend() != RESULT["backend"],
                    reason=f"checked in the {RESULT['backend']} pass, which scored the model")
@pytest.mark.skipif(not (FASHION_MNIST / "t10k-images-idx3-ubyte.gz").exists(),
                    reason="needs Debian's dataset-fashion-mnist")
def test_regression_committed_main_job_model_still_scores_its_recorded_result():
    model = keras.saving.load_model(RUN / "model.keras", safe_mode=True)
    # 10,000 images: four decimals of accuracy name the count of correct images exactly
    recorded = (RESULT["test_accuracy"], RESULT["test_accuracy_single_view"], RESULT["test_top5"])
    assert correct_on_test_split(model) == tuple(round(value * 10_000) for value in recorded)
