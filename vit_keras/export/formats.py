"""The export formats, one record each: the file it writes, how far its outputs may stray
from the Keras model's, and how it is written from the SavedModel that every export starts
from. A new format is one more ExportFormat in FORMATS (docs/contributing.md shows one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """An export format: one record each in FORMATS, so that a new format is one more entry.

    Args:
        name: the format's name in FORMATS.
        file_name: the file or folder it writes in the export folder.
        tolerance: (largest |probability - Keras probability| or None, smallest top-1
            agreement) on the verification images.
        write: write(serving model, SavedModel folder, path, representative uint8 images or
            None) makes the file.
    """

    name: str
    file_name: str
    tolerance: tuple[float | None, float]
    write: Callable


def tflite_bytes(saved_model_dir: str, configure: Callable | None = None,
                 representative=None) -> bytes:
    """A LiteRT (TFLite) flatbuffer of a SavedModel, with builtin ops only so that the
    standard runtime runs it.

    Args:
        saved_model_dir: the SavedModel folder.
        configure: configure(converter, representative) sets a quantization; None for
            float32.
        representative: uint8 images for a full-integer quantization's calibration.

    Returns:
        The .tflite file's bytes.
    """
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if configure is not None:
        configure(converter, representative)
    return converter.convert()


def float16_weights(converter, _representative) -> None:
    import tensorflow as tf

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]


def dynamic_range_int8(converter, _representative) -> None:
    import tensorflow as tf

    converter.optimizations = [tf.lite.Optimize.DEFAULT]


def full_integer_int8(converter, representative) -> None:
    import tensorflow as tf

    if representative is None:
        raise ValueError("full-integer int8 needs representative images for calibration")
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([image[None]] for image in representative)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]


def tflite(configure: Callable | None = None) -> Callable:
    """A writer of TFLite files with the given quantization."""

    def write(_serving, saved_model_dir, path, representative):
        with open(path, "wb") as file:
            file.write(tflite_bytes(saved_model_dir, configure, representative))

    return write


def saved_model(_serving, _saved_model_dir, _path, _representative) -> None:
    """Written before every other format, which all start from it."""


def onnx(serving, _saved_model_dir, path, _representative) -> None:
    serving.export(path, format="onnx", verbose=False)


FORMATS: dict[str, ExportFormat] = {f.name: f for f in (
    ExportFormat("saved_model", "saved_model", (1e-4, 1.0), saved_model),
    ExportFormat("tflite_float32", "model_float32.tflite", (1e-4, 1.0), tflite()),
    ExportFormat("tflite_float16", "model_float16.tflite", (1e-2, 0.99),
                 tflite(float16_weights)),
    ExportFormat("tflite_dynamic_int8", "model_dynamic_int8.tflite", (None, 0.99),
                 tflite(dynamic_range_int8)),
    ExportFormat("tflite_int8", "model_int8.tflite", (None, 0.99), tflite(full_integer_int8)),
    ExportFormat("onnx", "model.onnx", (1e-4, 1.0), onnx),
)}
"""The export formats by name: "saved_model", "tflite_float32", "tflite_float16",
"tflite_dynamic_int8", "tflite_int8" (full-integer, calibrated on representative images) and
"onnx", each with the tolerance its verification allows."""
