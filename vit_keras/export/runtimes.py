"""Running an exported file (or a .keras model) on uint8 images: one runtime per file type,
chosen by the file's name."""

from __future__ import annotations

import os

import keras
import numpy as np

from vit_keras.export.serving import serving_model
from vit_keras.weights.files import load_model


class SavedModelRuntime:
    """A SavedModel folder through its serving_default signature."""

    reader = "TensorFlow"

    def __init__(self, path: str):
        import tensorflow as tf

        self._run = tf.saved_model.load(path).signatures["serving_default"]
        self.input_shape = tuple(self._run.structured_input_signature[1]["images"].shape[1:])

    @staticmethod
    def accepts(path: str) -> bool:
        return os.path.isdir(path)

    def __call__(self, images):
        return {k: v.numpy() for k, v in self._run(images=images).items()}


class LiteRTRuntime:
    """A .tflite file through LiteRT's interpreter, one image at a time (batch 1 files)."""

    reader = "LiteRT"

    def __init__(self, path: str):
        from ai_edge_litert.interpreter import Interpreter

        self._runner = Interpreter(model_path=path).get_signature_runner("serving_default")
        detail = self._runner.get_input_details()["images"]
        self.input_shape = tuple(int(d) for d in detail["shape"][1:])

    @staticmethod
    def accepts(path: str) -> bool:
        return path.endswith(".tflite")

    def __call__(self, images):
        outputs = [self._runner(images=image[None]) for image in images]
        return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}


class OnnxRuntime:
    """An .onnx file through onnxruntime."""

    reader = "onnxruntime"

    def __init__(self, path: str):
        import onnxruntime

        self._session = onnxruntime.InferenceSession(path)
        self.input_shape = tuple(self._session.get_inputs()[0].shape[1:])

    @staticmethod
    def accepts(path: str) -> bool:
        return path.endswith(".onnx")

    def __call__(self, images):
        names = [o.name for o in self._session.get_outputs()]
        return dict(zip(names, self._session.run(names, {"images": images}), strict=True))


class KerasRuntime:
    """A .keras model (or one read from it and changed, given as model), wrapped in the same
    uint8 serving function as the exports."""

    def __init__(self, path: str, model: keras.Model | None = None):
        model = load_model(path, compile=False) if model is None else model
        self._model = serving_model(model)
        self.input_shape = tuple(self._model.input.shape[1:])

    @staticmethod
    def accepts(path: str) -> bool:
        return path.endswith(".keras")

    def __call__(self, images):
        return {k: keras.ops.convert_to_numpy(v) for k, v in self._model(images).items()}


def sides_text(sides) -> str:
    """Sizes for messages, "any" where a model of dynamic image size takes any."""
    return ", ".join("any" if side is None else str(side) for side in sides)


RUNTIMES = (SavedModelRuntime, LiteRTRuntime, OnnxRuntime, KerasRuntime)


class Predictor:
    """Runs one exported file or .keras model on uint8 images, with the runtime its file type
    needs (TensorFlow for a SavedModel folder, LiteRT for .tflite, onnxruntime for .onnx,
    Keras for .keras), so that every export is called the same way. Called on uint8 images
    (batch, height, width, channels), it returns {"logits", "probabilities"} as NumPy
    arrays.

    Args:
        path: a SavedModel folder, or a .tflite, .onnx or .keras file.
        model: the keras.Model read from a .keras path and changed (a token budget, say), run
            in the file's place; None runs the file.

    Raises:
        ValueError: a path of another kind, or a file its runtime cannot read, or a model
            given with a path that is no .keras file (at construction); images of another
            dtype or shape than the file takes (at a call).
        ImportError: the runtime's package is not installed.
    """

    def __init__(self, path: str, model: keras.Model | None = None):
        self.path = os.fspath(path)
        runtime = next((r for r in RUNTIMES if r.accepts(self.path)), None)
        if runtime is None:
            raise ValueError(f"{self.path!r}: expected a .keras, SavedModel folder, .tflite or "
                             ".onnx model")
        if model is not None:
            if runtime is not KerasRuntime:
                raise ValueError(f"{self.path!r}: a model is run in place of a .keras file "
                                 f"only, not of an export")
            self._runtime = KerasRuntime(self.path, model)
            self.input_shape = self._runtime.input_shape
            return
        try:
            self._runtime = runtime(self.path)
        except ImportError:  # the reader's package is missing, not the file bad
            raise
        except Exception as err:  # each reader raises its own types for a file it cannot read
            if runtime is KerasRuntime:  # load_model's errors name the file already
                raise
            raise ValueError(f"{self.path!r} could not be read by {runtime.reader}: "
                             f"{str(err).strip()}") from err
        self.input_shape = self._runtime.input_shape

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        images = np.asarray(images)
        if images.dtype != np.uint8 or not self.takes(images.shape[1:]):
            raise ValueError(f"{self.path}: expected uint8 images of shape (batch, "
                             f"{sides_text(self.input_shape)}), got {images.dtype} "
                             f"{images.shape}")
        return self._runtime(images)

    def takes(self, shape) -> bool:
        """Whether images of a shape fit the file's input; None, in a file of a dynamic-size
        model, takes any size.

        Args:
            shape: (height, width, channels).

        Returns:
            True where a call takes images of that shape.
        """
        return len(shape) == len(self.input_shape) and all(
            expected in (None, side)
            for expected, side in zip(self.input_shape, shape, strict=True))
