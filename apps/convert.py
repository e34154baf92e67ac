"""Converts weights between .npz (official layout), .keras and .weights.h5, and imports timm /
Hugging Face weights (.safetensors, .pth), printing what was loaded, resampled and left out.

vit-keras convert SRC DST [--variant B/16 --image-size 384 --num-classes 10 ...]

A .keras source carries its architecture. An .npz source gives the model's shape, image size
and classes by its arrays' shapes unless flags say otherwise; any other source needs --variant
(or every shape flag).
"""

from .common import (
    SHAPE_FLAGS,
    add_model_arguments,
    app_parser,
    load_model,
    model_from_arguments,
    run,
)


def build_parser():
    parser = app_parser("convert", __doc__)
    parser.add_argument("source", help="weights to read: .npz, .keras, .weights.h5, "
                                       ".safetensors, .pth")
    parser.add_argument("destination", help="file to write: .npz, .keras or .weights.h5")
    add_model_arguments(parser, "an .npz source's shapes give the model, its image size and "
                                "classes; other sources need --variant or every shape flag; "
                                "--image-size and --num-classes are 224 and 1000 where the "
                                "source does not say", image_size=None, num_classes=None)
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    return parser


def describe_source(args) -> None:
    """Fills --variant, --image-size and --num-classes that were not given: from an .npz
    checkpoint's shapes, else the defaults; a source whose shapes say nothing needs the
    variant."""
    from vit_keras.configs import variant_name
    from vit_keras.weights.npz import read_npz_shape

    image_size = num_classes = None
    if args.variant is None and args.source.endswith(".npz"):
        args.variant, image_size, num_classes = read_npz_shape(args.source)
        shape = ", ".join(f"{field} {getattr(args.variant, field)}" for field in SHAPE_FLAGS)
        print(f"{args.source}: {variant_name(args.variant) or 'custom shape'} ({shape}), "
              f"{image_size or 'unknown'} px, {num_classes or 'no'} classes by its shapes")
    elif args.variant is None:
        if not all(getattr(args, flag) is not None for flag in SHAPE_FLAGS):
            raise ValueError(f"{args.source}: pass --variant (e.g. --variant B/16) or every "
                             "shape flag: only an .npz source's shapes give the model")
        args.variant = "B/16"  # every field is overridden by the shape flags
    args.image_size = args.image_size or image_size or 224
    args.num_classes = args.num_classes or num_classes or 1000


def main(argv=None):
    args = build_parser().parse_args(argv)
    from vit_keras.weights import load_weights, save_weights

    if args.source.endswith(".keras"):
        model = load_model(args.source)
        print(f"{args.source}: whole model {model.name}, {model.count_params():,} parameters")
    else:
        describe_source(args)
        model = model_from_arguments(args)
        report = load_weights(model, args.source)
        print(report if report is not None else f"{args.source}: loaded")
    save_weights(model, args.destination, overwrite=args.overwrite)
    print(f"wrote {args.destination}")


if __name__ == "__main__":
    run(main)
