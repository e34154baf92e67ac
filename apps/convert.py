"""Converts weights between .npz (official layout), .keras and .weights.h5, and imports timm /
Hugging Face weights (.safetensors, .pth), printing what was loaded, resampled and left out.

vit-keras convert SRC DST [--variant B/16 --image-size 384 --num-classes 10 ...]

A .keras source carries its architecture; any other source needs the model described by flags.
"""

from .common import add_model_arguments, app_parser, load_model, model_from_arguments, run


def build_parser():
    parser = app_parser("convert", __doc__)
    parser.add_argument("source", help="weights to read: .npz, .keras, .weights.h5, "
                                       ".safetensors, .pth")
    parser.add_argument("destination", help="file to write: .npz, .keras or .weights.h5")
    add_model_arguments(parser, "B/16")
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    from vit_keras.weights import load_weights, save_weights

    if args.source.endswith(".keras"):
        model = load_model(args.source)
        print(f"{args.source}: whole model {model.name}, {model.count_params():,} parameters")
    else:
        args.variant = args.variant or "B/16"
        model = model_from_arguments(args)
        report = load_weights(model, args.source)
        print(report if report is not None else f"{args.source}: loaded")
    save_weights(model, args.destination, overwrite=args.overwrite)
    print(f"wrote {args.destination}")


if __name__ == "__main__":
    run(main)
