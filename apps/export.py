"""Exports a trained model (.keras, from any backend) to SavedModel, TFLite (float32, float16,
dynamic-range int8, full-integer int8) and ONNX under savedmodels/<name>/, verifying each
against the Keras model on held-out images and writing export_report.json.

vit-keras export runs/fashion_mnist/model.keras [--name fashion_mnist] [--overwrite]
vit-keras export runs/fashion_mnist/model.keras --merge-tokens 8

With a token budget (--merge-tokens, --prune-tokens) the files compute the merged or pruned
model, verified against it, in savedmodels/<name>_merge8 (say), and export_report.json
records the budget ("token_budget").
"""

import json
import os
import subprocess
import sys

from .common import (
    EXPORT_FORMATS,
    LABELS_FILE,
    RESULT_FILE,
    add_data_arguments,
    add_token_budget_arguments,
    app_parser,
    beside_model,
    check_token_budget,
    load_model,
    positive_int,
    run,
    with_token_budget,
)


def build_parser():
    parser = app_parser("export", __doc__)
    parser.add_argument("model", help="a .keras file")
    parser.add_argument("--name", help="folder name under savedmodels/ (default: the run's, "
                                       "with the token budget's, e.g. fashion_mnist_merge8)")
    parser.add_argument("--out", help="output folder (default savedmodels/<name>)")
    parser.add_argument("--formats", nargs="+", default=None, choices=EXPORT_FORMATS,
                        metavar="FORMAT",
                        help=f"some of {', '.join(EXPORT_FORMATS)} (default: all)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the exports in an existing folder (other files stay)")
    add_data_arguments(parser, "verification and calibration images (default: the data the "
                               "model was trained on, from result.json beside it)", dataset=None)
    parser.add_argument("--samples", type=positive_int, default=200,
                        help="held-out images to verify on")
    parser.add_argument("--calibration", type=positive_int, default=100,
                        help="training images for int8 calibration")
    add_token_budget_arguments(parser, "the model before it is exported")
    return parser


def budget_suffix(args, budget: dict | None) -> str:
    """The default folder name's ending for a token budget: "_merge8", "_prune0.7", and the
    pruning blocks where --prune-blocks chose them ("_prune0.5_blocks2-5")."""
    if budget is None:
        return ""
    if budget["method"] == "merge_tokens":
        return f"_merge{args.merge_tokens}"
    blocks = "-".join(str(block) for block in budget["blocks"])
    return f"_prune{args.prune_tokens:g}" + (f"_blocks{blocks}" if args.prune_blocks and blocks
                                              else "")


def image_source(dataset=None, folder=None, eval_folder=None, data_dir=None,
                 train_split="train", eval_split="test") -> dict:
    """Every key images_for reads: a folder's images (eval_folder for the held-out ones), else
    a dataset's splits."""
    return {"dataset": dataset, "folder": folder, "eval_folder": eval_folder,
            "data_dir": data_dir, "train_split": train_split, "eval_split": eval_split}


def data_source(args) -> dict:
    """Where the verification and calibration images come from: the flags, else the data
    the model's training run recorded in result.json beside it."""
    if args.dataset or args.folder:
        return image_source(args.dataset or "fashion_mnist", args.folder, args.folder,
                            args.data_dir)
    result = beside_model(args.model, RESULT_FILE)
    recorded = {}
    if os.path.exists(result):
        with open(result) as file:
            recorded = json.load(file).get("data", {})
    if not recorded:
        raise ValueError(f"no data to verify the export on: {result!r} does not say what "
                         f"{args.model!r} was trained on; pass --dataset or --folder")
    if recorded.get("folder"):  # a folder's run: its held-out folder, else its own images
        return image_source(folder=recorded["folder"],
                            eval_folder=recorded.get("eval_folder") or recorded["folder"])
    return image_source(recorded["dataset"], data_dir=args.data_dir or recorded.get("data_dir"),
                        train_split=recorded.get("train_split", "train"),
                        eval_split=recorded.get("eval_split", "test"))


def images_for(source: dict, model, split: str, count: int):
    """`count` uint8 images of the train or eval split, at the model's size; refuses data
    whose class count is not the model's."""
    from vit_keras import data, intermediates

    folder = source["folder"] if split == "train" else source["eval_folder"]
    dataset, names = data.load_source(source["dataset"], source[f"{split}_split"], folder,
                                      source["data_dir"])
    classes = model.outputs[0].shape[-1]
    if names and len(names) != classes:
        raise ValueError(f"the data has {len(names)} classes but the model has {classes}: "
                         "pass the --dataset or --folder it was trained on")
    return data.sample_images(dataset, intermediates.built_image_size(model),
                              model.input.shape[-1], count)


def export_under_tensorflow(argv) -> None:
    """The .keras file is backend-neutral and the converters need TensorFlow: run this app
    again in a TensorFlow process."""
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run([sys.executable, "-m", __spec__.name, *argv], env=env)
    if done.returncode:
        raise SystemExit(done.returncode)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    import keras

    from vit_keras import export
    from vit_keras.tokens.budget import token_budget

    check_token_budget(args)
    if keras.backend.backend() != "tensorflow":
        return export_under_tensorflow(argv)
    model = with_token_budget(args, load_model(args.model))
    name = args.name or (os.path.basename(beside_model(args.model))
                         + budget_suffix(args, token_budget(model)))
    out = args.out or os.path.join("savedmodels", name)
    export.check_output_folder(out, args.overwrite)  # before the data is read
    labels_file = beside_model(args.model, LABELS_FILE)
    labels = open(labels_file).read().splitlines() if os.path.exists(labels_file) else None
    source = data_source(args)
    samples = images_for(source, model, "eval", args.samples)
    calibration = images_for(source, model, "train", args.calibration)
    try:
        report = export.export_all(model, out, samples, calibration, labels,
                                   formats=tuple(args.formats or EXPORT_FORMATS),
                                   overwrite=args.overwrite)
    finally:
        report_path = os.path.join(out, export.REPORT_FILE)
        if os.path.exists(report_path):
            with open(report_path) as file:
                print(json.dumps(json.load(file)["formats"], indent=1))
    print(f"exported to {out}")
    return report


if __name__ == "__main__":
    run(main)
