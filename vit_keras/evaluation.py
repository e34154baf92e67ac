"""Classification metrics of a trained model on a held-out set: top-1, top-5, per-class
accuracy and the confusion matrix (as numbers and as a PNG), of each image's logits or of
their average with its mirror's (test-time flip)."""

from __future__ import annotations

import keras
import numpy as np

__all__ = ["classification_report", "predict_labels", "predict_views", "save_confusion_matrix",
           "with_mirrors"]


def predict_views(model: keras.Model, batches, mirror: bool = False):
    """Runs a model over every batch of a dataset, and over each image's horizontal mirror
    too where asked, keeping both views apart so that a caller can report either.

    Args:
        model: a classifier whose outputs are logits.
        batches: an iterable of (images (batch, height, width, channels), one-hot labels)
            batches, such as a tf.data.Dataset from vit_keras.data.make_pipeline.
        mirror: also predict each image flipped left to right.

    Returns:
        (logits, mirrored, labels): the logits (images, classes), the mirrors' logits or
        None without mirror, and the true class indices (images,), all NumPy arrays.
    """
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
    """The logits and true labels over a dataset; with mirror, each image's logits averaged
    with its horizontal mirror's (test-time flip), for a model trained on randomly flipped
    images.

    Args:
        model: a classifier whose outputs are logits.
        batches: an iterable of (images, one-hot labels) batches.
        mirror: average each image's logits with its mirror's.

    Returns:
        (logits, labels): NumPy arrays of shape (images, classes) and (images,).
    """
    logits, mirrored, labels = predict_views(model, batches, mirror)
    return with_mirrors(logits, mirrored), labels


def with_mirrors(logits: np.ndarray, mirrored: np.ndarray | None) -> np.ndarray:
    """The logits averaged with their mirrors', the test-time flip's score.

    Args:
        logits: the images' logits (images, classes).
        mirrored: the mirrors' logits, of the same shape, or None.

    Returns:
        (logits + mirrored) / 2, or logits where mirrored is None.
    """
    return logits if mirrored is None else (logits + mirrored) / 2


def classification_report(logits: np.ndarray, labels: np.ndarray,
                          class_names: list[str]) -> dict:
    """Top-1, top-5, per-class accuracy and the confusion matrix of a set's logits, as plain
    numbers that serialise to JSON (apps.evaluate writes them to a report).

    Args:
        logits: (images, classes) scores; any monotone transform of them gives the same
            report.
        labels: the true class indices (images,).
        class_names: one name per class, in class order.

    Returns:
        A dict: "images" (the count), "top1" and "top5" (accuracies in [0, 1]),
        "per_class" (each class name's recall) and "confusion_matrix" (rows true, columns
        predicted, counts as nested lists).
    """
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
    """Draws a confusion matrix as a PNG, each cell's count written in it, with Matplotlib's
    file-only backend so that it needs no display.

    Args:
        matrix: counts (classes, classes), rows the true class, columns the predicted one
            (classification_report's "confusion_matrix").
        class_names: one name per class, for the axes.
        path: the image file to write.
    """
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
