"""Weights in and out of a model by file name: the dispatcher that picks the reader or writer."""

from __future__ import annotations

import os
import zipfile

import keras

from vit_keras import compat, configs
from vit_keras.weights import pretrained
from vit_keras.weights.assign import LoadReport, load_params
from vit_keras.weights.keras_hub import load_keras_hub
from vit_keras.weights.npz import load_npz, model_params, save_npz
from vit_keras.weights.pytorch import TORCH_SUFFIXES, load_pytorch_weights


def portable_jit_compile(model: keras.Model) -> keras.Model:
    """The model, its saved compile state saying jit_compile "auto" whatever it compiled with;
    it still runs as compiled. Keras records the value compile resolved ("auto" is True on
    JAX), and a .keras file loaded with its compile state compiles so on every backend: on
    PyTorch, True sends the first predict through torch.compile. "auto" lets the loading
    backend choose, as a fresh compile would.

    Args:
        model: a model, compiled or not (then nothing changes).

    Returns:
        The same model.
    """
    compat.set_saved_jit_compile(model, "auto")
    return model


def load_model(path: str | os.PathLike, compile: bool = True) -> keras.Model:
    """A .keras file as a model, in safe mode. With its compile state (optimizer, loss,
    metrics), the model compiles as saved except for jit_compile, which is "auto" whatever the
    file records: an older file records the value its run resolved (True on JAX and with XLA
    on TensorFlow), which on PyTorch would send the first predict through torch.compile.

    Args:
        path: the .keras file.
        compile: keep the file's compile state; False for a model that only predicts.

    Returns:
        The model, compiled if the file has a compile state and compile is True.

    Raises:
        FileNotFoundError: a file that does not exist.
        ValueError: a file that is no zip archive, or a damaged one (naming the file).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file {path!r} does not exist")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"model file {path!r} is not a readable .keras file (not a zip "
                         "archive: truncated or another format)")
    try:
        model = keras.saving.load_model(path, compile=compile, safe_mode=True)
    except Exception as err:  # Keras raises many types for a damaged archive
        raise ValueError(f"model file {path!r} could not be read: {err}") from err
    if model.compiled:
        model.jit_compile = compat.auto_jit_compile(model)
        portable_jit_compile(model)
    return model


def _built_grid(model: keras.Model) -> tuple[int, int] | None:
    """The grid of patches a saved ViT's relative-position tables are built for: its
    position-embedding layer's (recorded in every .keras file of a vk.vit model)."""
    layer = next((layer for layer in model.layers
                  if layer.name == configs.POSITION_EMBEDDING), None)
    return None if layer is None else tuple(layer.grid_size)


def load_weights(model: keras.Model, weights: str, variant=None) -> LoadReport | None:
    """Loads weights into a model, choosing the reader by the file name, so that one call
    takes every layout vit_keras reads. Every reader but .weights.h5 loads by checkpoint
    name and checks the whole file before assigning anything: position embeddings are
    resampled for a model of another image size, and a head that does not fit starts at
    zero (both said in the report).

    Args:
        model: a vk.vit model built with the checkpoint's options.
        weights: a pre-trained name (vit_keras.weights.pretrained, fetched once into the
            Keras cache), an official .npz, a .keras model, a .weights.h5 file, timm or
            Hugging Face weights (.safetensors, .pth, .pt, .bin), or a keras-hub preset
            directory (with metadata.json).
        variant: the variant whose checkpoint a pre-trained name stands for ("B/16");
            unused for files.

    Returns:
        The LoadReport of what was loaded, or None for a .weights.h5 file (Keras' own
        loader, which matches variables by position).

    Raises:
        FileNotFoundError: a file that does not exist.
        ValueError: neither a pre-trained name nor a known file type, or a checkpoint that
            does not fit the model (its message names the vk.vit option that differs).
    """
    path = os.fspath(pretrained.resolve(weights, variant))
    if not os.path.exists(path):
        if not os.path.splitext(path)[1] and os.sep not in path:  # a word: a misspelt name
            raise ValueError(f"weights {path!r} is neither a pre-trained name (one of "
                             f"{', '.join(pretrained.names())}) nor a file or keras-hub "
                             "preset directory that exists")
        raise FileNotFoundError(f"weights file {path!r} does not exist")
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "metadata.json")):
        return load_keras_hub(model, path)
    if path.endswith(".weights.h5"):
        model.load_weights(path)
    elif path.endswith(".keras"):
        saved = load_model(path, compile=False)
        return load_params(model, model_params(saved), path, "Keras model (.keras)",
                           grid=_built_grid(saved))
    elif path.endswith(".npz"):
        return load_npz(model, path)
    elif path.endswith(TORCH_SUFFIXES):
        return load_pytorch_weights(model, path)
    else:
        raise ValueError(f"weights {path!r}: expected a .npz, .keras, .weights.h5 or "
                         f"{', '.join(TORCH_SUFFIXES)} file, a keras-hub preset directory, or "
                         "a pre-trained name "
                         f"({', '.join(pretrained.names())})")
    return None


def save_weights(model: keras.Model, path: str, overwrite: bool = False) -> None:
    """Writes a model's weights in the format its file name says, never over a file that
    exists unless asked.

    Args:
        model: a vk.vit model.
        path: a .npz file (the official checkpoint layout, LoRA adapters merged), a .keras
            file (the whole model; its compile state says jit_compile "auto",
            portable_jit_compile) or a .weights.h5 file (Keras' weights).
        overwrite: replace a file that exists.

    Raises:
        FileExistsError: path exists and overwrite is False.
        ValueError: a file name of another type.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path!r} exists; pass overwrite=True to replace it")
    if path.endswith(".npz"):
        save_npz(model, path, overwrite=True)
    elif path.endswith(".keras"):
        portable_jit_compile(model).save(path)
    elif path.endswith(".weights.h5"):
        model.save_weights(path)
    else:
        raise ValueError(f"cannot write {path!r}: expected a .npz, .keras or .weights.h5 name")
