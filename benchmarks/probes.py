"""The paper's probes of a frozen representation (Section 4.1, metrics): few-shot accuracy by
regularised least squares on a few training images per class, and a linear probe on more, each
scored on held-out Fashion-MNIST test images."""

import keras
import numpy as np

import vit_keras as vk
from vit_keras import analysis, data

PROBE_TRAIN, PROBE_TEST = 10_000, 10_000  # images of each split the probes see
SHOTS = (1, 5, 10, 25)


def representation_features(model: keras.Model, images: np.ndarray) -> np.ndarray:
    inputs = vk.preprocess(np.repeat(images, 3, axis=-1))
    return np.asarray(analysis.representation(model).predict(inputs, batch_size=500,
                                                             verbose=0))


def probes(model: keras.Model, limit: int | None, shots=SHOTS, draws: int = 3) -> dict:
    """Few-shot accuracies (mean over `draws` random draws of the shots) and a linear probe on
    PROBE_TRAIN images, scored on PROBE_TEST held-out images (a smoke run's `limit` of each)."""
    train_images, train_labels = data.load_fashion_mnist("train")
    test_images, test_labels = data.load_fashion_mnist("test")
    count = min(limit or PROBE_TRAIN, PROBE_TRAIN)
    held_out = min(limit or PROBE_TEST, PROBE_TEST)
    features_train = representation_features(model, train_images[:count])
    features_test = representation_features(model, test_images[:held_out])
    few = analysis.few_shot(features_train, train_labels[:count], features_test,
                            test_labels[:held_out], shots=shots, seeds=draws)
    linear = analysis.linear_fewshot_accuracy(features_train, train_labels[:count],
                                              features_test, test_labels[:held_out], 10,
                                              l2=1.0)
    return {"few_shot": {str(k): round(v, 4) for k, v in few.items()},
            "few_shot_draws": draws, "linear_probe": round(linear, 4),
            "probe_train_images": count, "probe_test_images": held_out}
