"""Converts weights between .npz (official layout), .keras and .weights.h5, and imports timm /
Hugging Face weights (.safetensors, .pth), printing what was loaded, resampled and left out.

python -m apps.convert SRC DST [--variant B/16 --image-size 384 --num-classes 10 ...]

A .keras source carries its architecture; any other source needs the model described by flags.
"""

import argparse

import keras

from apps.common import add_model_arguments, model_from_arguments
from vit_keras.weights import load_weights, save_weights


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("destination")
    add_model_arguments(parser)
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.source.endswith(".keras"):
        model = keras.saving.load_model(args.source, compile=False, safe_mode=True)
        print(f"{args.source}: whole model {model.name}, {model.count_params():,} parameters")
    else:
        model = model_from_arguments(args)
        report = load_weights(model, args.source)
        print(report if report is not None else f"{args.source}: loaded")
    save_weights(model, args.destination, overwrite=args.overwrite)
    print(f"wrote {args.destination}")


if __name__ == "__main__":
    main()
