"""Exports a trained model (.keras, from any backend) to SavedModel, TFLite (float32, float16,
dynamic-range int8, full-integer int8) and ONNX under savedmodels/<name>/, verifying each
against the Keras model on held-out images and writing export_report.json.

python -m apps.export runs/fashion_mnist/model.keras [--name fashion_mnist] [--overwrite]
"""

import argparse
import json
import os
import subprocess
import sys

import keras

from apps.common import add_data_arguments
from vit_keras import data, export
from vit_keras.export.formats import FORMATS


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .keras file")
    parser.add_argument("--name", help="folder name under savedmodels/ (default: the run's)")
    parser.add_argument("--out", help="output folder (default savedmodels/<name>)")
    parser.add_argument("--formats", nargs="+", default=None, choices=list(FORMATS),
                        help="some of the formats (default: all)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing export")
    add_data_arguments(parser, "verification and calibration images")
    parser.add_argument("--samples", type=int, default=200, help="held-out images to verify on")
    parser.add_argument("--calibration", type=int, default=100,
                        help="training images for int8 calibration")
    return parser


def images_for(args, model, split, count):
    dataset, _ = data.load_source(args.dataset, split, args.folder, args.data_dir)
    return data.sample_images(dataset, tuple(model.input.shape[1:3]), model.input.shape[-1],
                              count)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if keras.backend.backend() != "tensorflow":
        # The .keras file is backend-neutral; the converters need TensorFlow.
        env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
        done = subprocess.run([sys.executable, "-m", "apps.export", *argv], env=env)
        if done.returncode:
            raise SystemExit(done.returncode)
        return None
    args = build_parser().parse_args(argv)
    model = keras.saving.load_model(args.model, compile=False, safe_mode=True)
    name = args.name or os.path.basename(os.path.dirname(os.path.abspath(args.model)))
    out = args.out or os.path.join("savedmodels", name)
    labels_file = os.path.join(os.path.dirname(args.model), "labels.txt")
    labels = open(labels_file).read().splitlines() if os.path.exists(labels_file) else None
    samples = images_for(args, model, "test", args.samples)
    calibration = images_for(args, model, "train", args.calibration)
    try:
        report = export.export_all(model, out, samples, calibration, labels,
                                   formats=tuple(args.formats or FORMATS),
                                   overwrite=args.overwrite)
    finally:
        report_path = os.path.join(out, "export_report.json")
        if os.path.exists(report_path):
            with open(report_path) as file:
                print(json.dumps(json.load(file)["formats"], indent=1))
    print(f"exported to {out}")
    return report


if __name__ == "__main__":
    main()
