"""Classification metrics of a trained model on a held-out set: top-1, top-5, per-class
accuracy and the confusion matrix (as numbers and as a PNG)."""

from __future__ import annotations

import keras
import numpy as np


def predict_labels(model: keras.Model, batches) -> tuple[np.ndarray, np.ndarray]:
    """(logits, true labels) over a dataset of (images, one-hot labels) batches."""
    logits, labels = [], []
    for images, onehot in batches:
        logits.append(keras.ops.convert_to_numpy(model(images, training=False)))
        labels.append(np.argmax(np.asarray(onehot), axis=-1))
    return np.concatenate(logits), np.concatenate(labels)


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
