"""Classification metrics of a trained model on a held-out set: top-1, top-5, per-class
accuracy and the confusion matrix (as numbers and as a PNG), of each image's logits or of
their average with its mirror's (test-time flip)."""

from __future__ import annotations

import keras
import numpy as np


def predict_views(model: keras.Model, batches, mirror: bool = False):
    """(logits, logits of the horizontal mirrors or None, true labels) over a dataset of
    (images (batch, height, width, channels), one-hot labels) batches."""
    logits, mirrored, labels = [], [], []
    for images, onehot in batches:
        images = np.asarray(images)
        logits.append(np.asarray(model.predict_on_batch(images)))
        if mirror:
            mirrored.append(np.asarray(model.predict_on_batch(images[:, :, ::-1])))
        labels.append(np.argmax(np.asarray(onehot), axis=-1))
    return (np.concatenate(logits), np.concatenate(mirrored) if mirror else None,
            np.concatenate(labels))


def predict_labels(model: keras.Model, batches, mirror: bool = False):
    """(logits, true labels) over a dataset of (images, one-hot labels) batches. mirror=True
    averages each image's logits with its horizontal mirror's (test-time flip), for a model
    trained on randomly flipped images."""
    logits, mirrored, labels = predict_views(model, batches, mirror)
    return with_mirrors(logits, mirrored), labels


def with_mirrors(logits: np.ndarray, mirrored: np.ndarray | None) -> np.ndarray:
    """The logits averaged with their mirrors' (the logits alone where there are none)."""
    return logits if mirrored is None else (logits + mirrored) / 2


def classification_report(logits: np.ndarray, labels: np.ndarray,
                          class_names: list[str]) -> dict:
    num_classes = logits.shape[-1]
    predicted = logits.argmax(-1)
    top5 = np.argsort(-logits, axis=-1)[:, :5]
    matrix = np.zeros((num_classes, num_classes), int)
    np.add.at(matrix, (labels, predicted), 1)
    support = matrix.sum(axis=1)
    per_class = np.divide(np.diag(matrix), support, out=np.zeros(num_classes),
                          where=support > 0)
    return {"images": int(len(labels)), "top1": float((predicted == labels).mean()),
            "top5": float((top5 == labels[:, None]).any(axis=1).mean()),
            "per_class": {name: float(a) for name, a in zip(class_names, per_class, strict=True)},
            "confusion_matrix": matrix.tolist()}


def save_confusion_matrix(matrix, class_names: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = np.asarray(matrix)
    size = max(4.0, 0.6 * len(class_names) + 2)
    figure, axes = plt.subplots(figsize=(size, size))
    axes.imshow(matrix, cmap="Blues")
    axes.set_xticks(range(len(class_names)), class_names, rotation=90)
    axes.set_yticks(range(len(class_names)), class_names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    for (row, col), count in np.ndenumerate(matrix):
        axes.text(col, row, str(count), ha="center", va="center", fontsize=7,
                  color="white" if count > matrix.max() / 2 else "black")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
