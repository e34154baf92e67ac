"""Export for deployment: SavedModel, TFLite (LiteRT: float32, float16, dynamic-range int8,
full-integer int8) and ONNX, each verified against the Keras model right after it is written.

Every export takes uint8 images (batch, height, width, channels) and returns "logits" and
"probabilities"; the [-1, 1] scaling is inside. Export needs the TensorFlow backend; a model
trained on JAX or PyTorch is exported from its (backend-neutral) .keras file in a TensorFlow
process (apps.export does that by itself).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time

import keras
import numpy as np

FORMATS = ("saved_model", "tflite_float32", "tflite_float16", "tflite_dynamic_int8",
           "tflite_int8", "onnx")
FILES = {"saved_model": "saved_model", "tflite_float32": "model_float32.tflite",
         "tflite_float16": "model_float16.tflite",
         "tflite_dynamic_int8": "model_dynamic_int8.tflite", "tflite_int8": "model_int8.tflite",
         "onnx": "model.onnx"}
# Largest allowed |probability - Keras probability|, and smallest top-1 agreement.
TOLERANCES = {"saved_model": (1e-4, 1.0), "tflite_float32": (1e-4, 1.0),
              "onnx": (1e-4, 1.0), "tflite_float16": (1e-2, 0.99),
              "tflite_dynamic_int8": (None, 0.99), "tflite_int8": (None, 0.99)}


class ExportVerificationError(RuntimeError):
    """An export's outputs differ from the Keras model's by more than its tolerance."""


def serving_model(model: keras.Model, fold_class_token: bool = False) -> keras.Model:
    """uint8 images -> {"logits", "probabilities"}: the model with its preprocessing inside.

    fold_class_token: compute block 0's class-token rows at export (ClassTokenFolded), where
    the model has them; the function is unchanged.
    """
    images = keras.Input(model.input.shape[1:], dtype="uint8", name="images")
    scaled = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="to_unit_range")(images)
    if fold_class_token and ClassTokenFolded.applies_to(model):
        model = ClassTokenFolded(model)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(model(scaled))
    probabilities = keras.layers.Softmax(dtype="float32", name="probabilities")(logits)
    return keras.Model(images, {"logits": logits, "probabilities": probabilities},
                       name=f"{model.name}_serving")


class ClassTokenFolded(keras.Model):
    """The same function with block 0's class-token rows computed once, in float32.

    Why: the class token (plus its position embedding) enters the residual stream far smaller
    than the patch tokens (std 0.04 against 2.7 in a Ti/16 trained on Fashion-MNIST), so a
    full-integer file's per-tensor scales round it to zero, and block 0's LayerNorm 1/std,
    quantized over both ranges, loses the patch tokens' precision too. Those rows do not
    depend on the image: computing them here leaves the integer file only well-scaled tensors.
    """

    def __init__(self, model: keras.Model, **kwargs):
        super().__init__(name=model.name, **kwargs)
        self.patches = keras.Model(model.input, model.get_layer("embedding").output)
        self.block = model.get_layer("Transformer_encoderblock_0")
        class_row = keras.ops.convert_to_numpy(model.get_layer("cls").cls)
        table = model.get_layer("Transformer_posembed_input").embedding()
        self.patch_posemb = None
        if table is not None:
            table = keras.ops.convert_to_numpy(table)
            class_row, self.patch_posemb = class_row + table[:, :1], table[:, 1:]
        self.class_row = class_row
        self.class_normed = keras.ops.convert_to_numpy(self.block.norm_0(class_row))
        self.rest = model.layers[model.layers.index(self.block) + 1:]

    @classmethod
    def applies_to(cls, model: keras.Model) -> bool:
        """vit()'s chain with a class token: cls, position embedding, blocks, ..., output."""
        names = [layer.name for layer in model.layers]
        if not {"embedding", "cls", "Transformer_posembed_input",
                "Transformer_encoderblock_0"} <= set(names):
            return False
        rest = model.layers[names.index("Transformer_encoderblock_0"):]
        chained = all(len(later._inbound_nodes) == 1 and
                      later._inbound_nodes[0].parent_nodes[0].operation is earlier
                      for earlier, later in itertools.pairwise(rest))
        return chained and rest[-1].output is model.output

    def call(self, images):
        patches = self.patches(images)
        if self.patch_posemb is not None:
            patches = patches + keras.ops.cast(self.patch_posemb, patches.dtype)
        shape = (keras.ops.shape(patches)[0], 1, patches.shape[-1])

        def class_rows(row):
            return keras.ops.broadcast_to(keras.ops.cast(row, patches.dtype), shape)

        x = keras.ops.concatenate([class_rows(self.class_row), patches], axis=1)
        normed = keras.ops.concatenate(
            [class_rows(self.class_normed), self.block.norm_0(patches)], axis=1)
        x = self.block(x, normed=normed)
        for layer in self.rest:
            x = layer(x)
        return x


def _require_tensorflow():
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError("export needs KERAS_BACKEND=tensorflow (the .keras file is "
                           "backend-neutral: load it in a TensorFlow process)")


def tflite_bytes(saved_model_dir: str, kind: str, representative=None) -> bytes:
    """LiteRT flatbuffer from the SavedModel, builtin ops only."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if kind == "tflite_float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif kind == "tflite_dynamic_int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif kind == "tflite_int8":
        if representative is None:
            raise ValueError("full-integer int8 needs representative images for calibration")
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([image[None]] for image in representative)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    elif kind != "tflite_float32":
        raise ValueError(f"unknown TFLite kind {kind!r}")
    return converter.convert()


# ------------------------------------------------------------------ running exports


class Predictor:
    """Runs one exported file (or a .keras model) on uint8 images."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            import tensorflow as tf

            self._run = tf.saved_model.load(self.path).signatures["serving_default"]
            self.kind, self.input_shape = "saved_model", None
        elif self.path.endswith(".tflite"):
            from ai_edge_litert.interpreter import Interpreter

            self._interpreter = Interpreter(model_path=self.path)
            self._runner = self._interpreter.get_signature_runner("serving_default")
            self.kind = "tflite"
            detail = self._runner.get_input_details()["images"]
            self.input_shape = tuple(int(d) for d in detail["shape"][1:])
        elif self.path.endswith(".onnx"):
            import onnxruntime

            self._session = onnxruntime.InferenceSession(self.path)
            self.kind = "onnx"
            self.input_shape = tuple(self._session.get_inputs()[0].shape[1:])
        elif self.path.endswith(".keras"):
            self._model = serving_model(keras.saving.load_model(self.path, compile=False,
                                                                safe_mode=True))
            self.kind, self.input_shape = "keras", tuple(self._model.input.shape[1:])
        else:
            raise ValueError(f"{self.path!r}: expected a .keras, SavedModel folder, .tflite or "
                             ".onnx model")
        if self.kind == "saved_model":
            spec = self._run.structured_input_signature[1]["images"]
            self.input_shape = tuple(spec.shape[1:])

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        images = np.asarray(images)
        if images.dtype != np.uint8 or tuple(images.shape[1:]) != self.input_shape:
            raise ValueError(f"{self.path}: expected uint8 images of shape (batch, "
                             f"{', '.join(map(str, self.input_shape))}), got {images.dtype} "
                             f"{images.shape}")
        if self.kind == "saved_model":
            return {k: v.numpy() for k, v in self._run(images=images).items()}
        if self.kind == "tflite":  # one image at a time: the file is built for batch 1
            outputs = [self._runner(images=image[None]) for image in images]
            return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
        if self.kind == "onnx":
            names = [o.name for o in self._session.get_outputs()]
            return dict(zip(names, self._session.run(names, {"images": images}), strict=True))
        out = self._model(images)
        return {k: keras.ops.convert_to_numpy(v) for k, v in out.items()}


def verify(kind: str, path: str, images: np.ndarray, reference: dict,
           tolerance: tuple | None = None) -> dict:
    """Runs the export on images and compares it with the Keras model's outputs."""
    predictor = Predictor(path)
    predictor(images[:1])  # warm-up, not timed
    started = time.perf_counter()
    out = predictor(images)
    latency = (time.perf_counter() - started) / len(images)
    diff = float(np.abs(out["probabilities"] - reference["probabilities"]).max())
    agreement = float((out["probabilities"].argmax(-1)
                       == reference["probabilities"].argmax(-1)).mean())
    max_diff, min_agreement = tolerance or TOLERANCES[kind]
    passed = agreement >= min_agreement and (max_diff is None or diff <= max_diff)
    return {"file": os.path.basename(path), "size_bytes": _size(path),
            "max_abs_diff_probabilities": diff,
            "max_abs_diff_logits": float(np.abs(out["logits"] - reference["logits"]).max()),
            "top1_agreement": agreement, "latency_ms_per_image": round(latency * 1000, 3),
            "tolerance_probabilities": max_diff, "min_top1_agreement": min_agreement,
            "images": int(len(images)), "passed": bool(passed)}


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def export_all(model: keras.Model, out_dir: str, sample_images: np.ndarray,
               representative: np.ndarray | None = None, labels: list[str] | None = None,
               formats=FORMATS, overwrite: bool = False, tolerances: dict | None = None) -> dict:
    """Writes every format into out_dir (the graph with ClassTokenFolded where it applies),
    verifies each against the Keras model as given, writes export_report.json, and
    raises ExportVerificationError naming the formats past their tolerance (TOLERANCES,
    updated by `tolerances`: {format: (max |probability difference| or None,
    min top-1 agreement)})."""
    _require_tensorflow()
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown export formats {sorted(unknown)}: expected some of {FORMATS}")
    if os.path.exists(out_dir):
        if not overwrite:
            raise FileExistsError(f"{out_dir!r} exists; pass overwrite=True (--overwrite) to "
                                  "replace it")
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    reference = {k: keras.ops.convert_to_numpy(v)
                 for k, v in serving_model(model)(sample_images).items()}
    serving = serving_model(model, fold_class_token=True)
    saved_model_dir = os.path.join(out_dir, FILES["saved_model"])
    serving.export(saved_model_dir, format="tf_saved_model", verbose=False)
    report = {"model": model.name, "input_shape": list(model.input.shape[1:]), "formats": {}}
    for kind in formats:
        path = os.path.join(out_dir, FILES[kind])
        if kind.startswith("tflite"):
            with open(path, "wb") as file:
                file.write(tflite_bytes(saved_model_dir, kind, representative))
        elif kind == "onnx":
            serving.export(path, format="onnx", verbose=False)
        report["formats"][kind] = verify(kind, path, sample_images, reference,
                                         (tolerances or {}).get(kind))
    if "saved_model" not in formats:
        shutil.rmtree(saved_model_dir)
    if labels:
        with open(os.path.join(out_dir, "labels.txt"), "w") as file:
            file.write("\n".join(labels) + "\n")
    with open(os.path.join(out_dir, "export_report.json"), "w") as file:
        json.dump(report, file, indent=1)
    failed = [k for k, r in report["formats"].items() if not r["passed"]]
    if failed:
        raise ExportVerificationError(
            f"exports past their tolerance: {', '.join(failed)} (see "
            f"{os.path.join(out_dir, 'export_report.json')})")
    return report
