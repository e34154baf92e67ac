"""Converts weights between .npz (official layout), .keras and .weights.h5, and imports timm /
Hugging Face weights (.safetensors, .pth), printing what was loaded, resampled and left out.

vit-keras convert SRC DST [--variant B/16 --image-size 384 --num-classes 10 ...]

A .keras source carries its architecture. An .npz source gives the model's shape, classifier,
learned position embedding, image size and classes by its arrays unless flags say otherwise (a
fixed position embedding shows in no array: --posemb); any other source needs --variant (or
every shape flag).
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
    """Fills --variant, --classifier, --posemb, --image-size and --num-classes that were not
    given: from an .npz checkpoint's arrays, else the defaults; a source whose arrays say
    nothing needs the variant, and what an .npz cannot show (a fixed position embedding, the
    image size without a learned one) needs its flag."""
    if args.variant is None and args.source.endswith(".npz"):
        describe_npz(args)
    elif args.variant is None:
        if not all(getattr(args, flag) is not None for flag in SHAPE_FLAGS):
            raise ValueError(f"{args.source}: pass --variant (e.g. --variant B/16) or every "
                             "shape flag: only an .npz source's shapes give the model")
        args.variant = "B/16"  # every field is overridden by the shape flags
    args.image_size = args.image_size or 224
    args.num_classes = args.num_classes or 1000


def describe_npz(args) -> None:
    """describe_source for an .npz: what its arrays show, printed, and the flags they leave."""
    from vit_keras.configs import variant_name
    from vit_keras.weights.npz import read_npz_shape

    found = read_npz_shape(args.source)
    args.variant, args.classifier = found.config, args.classifier or found.classifier
    shape = ", ".join(f"{field} {getattr(found.config, field)}" for field in SHAPE_FLAGS)
    print(f"{args.source}: {variant_name(found.config) or 'custom shape'} ({shape}), "
          f"{found.image_size or 'unknown'} px, {found.num_classes or 'no'} classes, "
          f"{found.classifier} classifier, "
          f"{found.posemb or 'no learned'} position embedding by its arrays")
    if args.posemb is None and found.posemb is None:
        raise ValueError(f"{args.source}: holds no learned position embedding, so its model's "
                         "was fixed or none: pass --posemb sincos2d or --posemb none, as it "
                         "was trained")
    args.posemb = args.posemb or found.posemb
    if args.image_size is None and found.image_size is None:
        raise ValueError(f"{args.source}: its arrays do not give the image size (a learned "
                         "position embedding's square grid would): pass --image-size")
    args.image_size = args.image_size or found.image_size
    args.num_classes = args.num_classes or found.num_classes


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
