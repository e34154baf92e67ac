"""Weights in and out of a model, choosing the reader by file type."""

from __future__ import annotations

import os

import keras


def load_weights(model: keras.Model, path: str) -> None:
    """Loads `path` into `model`, choosing the reader by file type."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"weights file {path!r} does not exist")
    if path.endswith(".weights.h5"):
        model.load_weights(path)
    elif path.endswith(".keras"):
        saved = keras.saving.load_model(path, compile=False, safe_mode=True)
        model.set_weights(saved.get_weights())
    else:
        raise ValueError(f"weights {path!r}: expected a .npz, .keras or .weights.h5 file")
