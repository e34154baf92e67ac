"""Export for deployment: SavedModel, TFLite (LiteRT: float32, float16, dynamic-range int8,
full-integer int8) and ONNX, each verified against the Keras model right after it is written.

Every export takes uint8 images (batch, height, width, channels) and returns "logits" and
"probabilities"; the [-1, 1] scaling is inside. Export needs the TensorFlow backend; a model
trained on JAX or PyTorch is exported from its (backend-neutral) .keras file in a TensorFlow
process (apps.export does that by itself).
"""

from __future__ import annotations

import json
import os
import shutil
import time

import keras
import numpy as np

from vit_keras.export.formats import FORMATS, ExportFormat, tflite_bytes
from vit_keras.export.runtimes import Predictor
from vit_keras.export.serving import ClassTokenFolded, serving_model
from vit_keras.intermediates import built_image_size, takes_any_size
from vit_keras.tokens.budget import token_budget

__all__ = ["FORMATS", "ClassTokenFolded", "ExportFormat", "ExportVerificationError",
           "Predictor", "check_output_folder", "export_all", "serving_model", "tflite_bytes",
           "verify"]

# What an export writes into its folder besides the formats' files. Overwriting removes the
# formats' files, the report and the fixed-size folder first, and leaves anything else alone;
# labels.txt is replaced only by labels given (in a run's folder it is the run's own).
REPORT_FILE, LABELS_FILE = "export_report.json", "labels.txt"
FIXED_SIZE_DIR = "fixed_size_saved_model"


class ExportVerificationError(RuntimeError):
    """An export's outputs differ from the Keras model's by more than its tolerance."""


def _require_tensorflow():
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError("export needs KERAS_BACKEND=tensorflow (the .keras file is "
                           "backend-neutral: load it in a TensorFlow process)")


def verify(path: str, images: np.ndarray, reference: dict,
           tolerance: tuple[float | None, float]) -> dict:
    """Runs an exported file on images and compares its outputs with the Keras model's, so
    that an export that computes something else is caught where it is written.

    Args:
        path: the export (a SavedModel folder, .tflite or .onnx file).
        images: uint8 images (batch, height, width, channels).
        reference: the Keras serving model's outputs on images, "logits" and
            "probabilities".
        tolerance: (the largest |probability difference| allowed, or None for no bound; the
            smallest share of images whose top-1 class agrees).

    Returns:
        The format's line of the export report: its file and size, the largest probability
        and logit differences, the top-1 agreement, the latency per image, the tolerance
        and whether it passed.
    """
    predictor = Predictor(path)
    predictor(images[:1])  # warm-up, not timed
    started = time.perf_counter()
    out = predictor(images)
    latency = (time.perf_counter() - started) / len(images)
    diff = float(np.abs(out["probabilities"] - reference["probabilities"]).max())
    agreement = float((out["probabilities"].argmax(-1)
                       == reference["probabilities"].argmax(-1)).mean())
    max_diff, min_agreement = tolerance
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
               formats=tuple(FORMATS), overwrite: bool = False,
               tolerances: dict | None = None) -> dict:
    """Writes the formats into out_dir, each verified against the Keras model right after it
    is written, and export_report.json beside them. The exports start from a SavedModel of
    the serving model, with ClassTokenFolded where it applies; a model that takes any size
    exports its TFLite and ONNX files at the size it was built for. Needs the TensorFlow
    backend.

    Args:
        model: the Keras model (a vk.vit, or a model with one inside).
        out_dir: the folder to write into.
        sample_images: uint8 images of the model's size, to verify each export on.
        representative: uint8 images to calibrate full-integer int8 on; None if that format
            is not asked for.
        labels: class names to write as labels.txt beside the exports; None writes none.
        formats: names in FORMATS.
        overwrite: export into an existing folder, replacing an earlier export's files.
        tolerances: {format name: (largest |probability difference| or None, smallest top-1
            agreement)}, replacing those formats' own tolerances.

    Returns:
        The report written to export_report.json.

    Raises:
        RuntimeError: a backend other than TensorFlow.
        ValueError: an unknown format, or images of another size than the model's.
        FileExistsError: out_dir exists and overwrite is False.
        ExportVerificationError: some formats are past their tolerance (named; the files
            and the report are written all the same).
    """
    _require_tensorflow()
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown export formats {sorted(unknown)}: expected some of "
                         f"{', '.join(FORMATS)}")
    size = built_image_size(model)
    for name, images in (("sample_images", sample_images), ("representative", representative)):
        if images is not None and tuple(images.shape[1:3]) != size:
            raise ValueError(f"{name}: expected images of the model's {size[0]}x{size[1]} "
                             f"pixels, got {images.shape[1]}x{images.shape[2]}")
    _fresh_folder(out_dir, overwrite)
    reference = {k: keras.ops.convert_to_numpy(v)
                 for k, v in serving_model(model)(sample_images).items()}
    serving = serving_model(model, fold_class_token=True)
    saved_model_dir = os.path.join(out_dir, FORMATS["saved_model"].file_name)
    serving.export(saved_model_dir, format="tf_saved_model", verbose=False)
    report = {"model": model.name, "input_shape": list(model.input.shape[1:]), "formats": {}}
    budget = token_budget(model)
    if budget is not None:
        report["token_budget"] = budget
    fixed = _fixed_size_serving(model, serving, saved_model_dir, out_dir, report)
    try:
        for name in formats:
            export_format = FORMATS[name]
            path = os.path.join(out_dir, export_format.file_name)
            source = (serving, saved_model_dir) if name == "saved_model" else fixed
            export_format.write(*source, path, representative)
            tolerance = (tolerances or {}).get(name, export_format.tolerance)
            report["formats"][name] = verify(path, sample_images, reference, tolerance)
    finally:
        if fixed[1] != saved_model_dir:
            shutil.rmtree(fixed[1])
    if "saved_model" not in formats:
        shutil.rmtree(saved_model_dir)
    _write_side_files(out_dir, report, labels)
    failed = [k for k, r in report["formats"].items() if not r["passed"]]
    if failed:
        raise ExportVerificationError(
            f"exports past their tolerance: {', '.join(failed)} (see "
            f"{os.path.join(out_dir, REPORT_FILE)})")
    return report


def _fixed_size_serving(model, serving, saved_model_dir, out_dir, report):
    """(serving model, its SavedModel folder) for the formats of one image size (TFLite,
    ONNX): a model that takes any size is served at the size it was built for."""
    if not takes_any_size(model):
        return serving, saved_model_dir
    image_size = built_image_size(model)
    report["fixed_size_formats_input_shape"] = [*image_size, model.input.shape[-1]]
    fixed = serving_model(model, fold_class_token=True, image_size=image_size)
    fixed_dir = os.path.join(out_dir, FIXED_SIZE_DIR)
    fixed.export(fixed_dir, format="tf_saved_model", verbose=False)
    return fixed, fixed_dir


def check_output_folder(out_dir: str, overwrite: bool) -> None:
    """Checks an export's output folder before anything is computed, so that a mistaken path
    fails at once.

    Args:
        out_dir: the folder the export goes into.
        overwrite: whether an existing folder may be exported into.

    Raises:
        NotADirectoryError: out_dir is a file.
        FileExistsError: out_dir exists and overwrite is False.
    """
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotADirectoryError(f"{out_dir!r} is a file: exports go into a folder")
    if os.path.exists(out_dir) and not overwrite:
        raise FileExistsError(f"{out_dir!r} exists; pass --overwrite (overwrite=True) to "
                              "export into it, replacing an earlier export's files")


def _fresh_folder(out_dir: str, overwrite: bool) -> None:
    """out_dir made, or an earlier export's files removed from it (every format's, not only
    those asked for now, so that none is left stale beside the new report)."""
    check_output_folder(out_dir, overwrite)
    for name in (*(f.file_name for f in FORMATS.values()), REPORT_FILE, FIXED_SIZE_DIR):
        path = os.path.join(out_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    os.makedirs(out_dir, exist_ok=True)


def _write_side_files(out_dir: str, report: dict, labels: list[str] | None) -> None:
    if labels:
        with open(os.path.join(out_dir, LABELS_FILE), "w") as file:
            file.write("\n".join(labels) + "\n")
    with open(os.path.join(out_dir, REPORT_FILE), "w") as file:
        json.dump(report, file, indent=1)
