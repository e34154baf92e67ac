"""Command-line pieces the apps share: the parser, running with clear errors, describing a
model and a data source with flags, reading a saved model."""

import argparse
import dataclasses
import os
import sys
import traceback
import zipfile

import keras

import vit_keras as vk
from vit_keras import kernels
from vit_keras.export import ExportVerificationError
from vit_keras.models import CLASSIFIERS
from vit_keras.position_embeddings import POSITION_EMBEDDINGS
from vit_keras.weights import pretrained

SHAPE_FLAGS = ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size")
# How the usage line names a program; the console script sets "vit-keras {name}".
PROG = "python -m apps.{name}"
# A user's mistake: reported in one line, without a traceback (--debug shows it).
USER_ERRORS = (ValueError, OSError, zipfile.BadZipFile, ExportVerificationError)


class HelpFormatter(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default after its help."""


def app_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """A parser whose --help prints the app's whole docstring and every flag's default."""
    parser = argparse.ArgumentParser(prog=PROG.format(name=name), description=doc,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback when something goes wrong")
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's start-up and runtime log lines")
    return parser


def run(main, argv=None):
    """main(argv), with a user's mistake reported in one line on stderr and exit status 2;
    --debug shows the traceback instead."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return main(argv)
    except USER_ERRORS as err:
        if "--debug" in argv:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _whole_number(text, 1, "a positive whole number")


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return _whole_number(text, 0, "a whole number of at least 0")


def _whole_number(text: str, minimum: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def load_model(path: str) -> keras.Model:
    """A .keras file in safe mode; a missing file and an unreadable one are told apart."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file {path!r} does not exist")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"model file {path!r} is not a readable .keras file (not a zip "
                         "archive: truncated or another format)")
    try:
        return keras.saving.load_model(path, compile=False, safe_mode=True)
    except Exception as err:  # Keras raises many types for a damaged archive
        raise ValueError(f"model file {path!r} could not be read: {err}") from err


def add_model_arguments(parser: argparse.ArgumentParser, variant: str | None = "B/16",
                        image_size: int | None = 224, num_classes: int = 1000) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--variant", default=variant, help=f"e.g. Ti/16, B/16 (default {variant})")
    for flag in SHAPE_FLAGS:
        group.add_argument("--" + flag.replace("_", "-"), type=positive_int, default=None,
                           help="override the variant's value (custom shapes)")
    group.add_argument("--image-size", type=positive_int, default=image_size,
                       help="image height and width in pixels")
    group.add_argument("--num-classes", type=positive_int, default=num_classes,
                       help="classes of the head (a dataset's own count wins where known)")
    group.add_argument("--classifier", default=None, choices=CLASSIFIERS,
                       help=f"default {CLASSIFIERS[0]}")
    group.add_argument("--posemb", default=None, choices=list(POSITION_EMBEDDINGS),
                       help="position embedding (default learned)")
    group.add_argument("--representation-size", type=positive_int, default=None,
                       help="width of the paper's tanh pre_logits layer (none if not given)")
    group.add_argument("--exact-gelu", action="store_true",
                       help="erf GELU (timm / Hugging Face weights) instead of the tanh one")
    group.add_argument("--attention-kernel", default="auto", choices=kernels.ATTENTION_KERNELS,
                       help="how attention is computed (vit_keras.kernels; default auto)")
    group.add_argument("--family", choices=pretrained.names(), default=None,
                       help="build the model with the vk.vit options of this named release "
                            "(LayerScale, registers, CLIP's pre-norm, ...: python -m "
                            "apps.variants --pretrained), for its files and fine-tunes")


def model_config(args) -> vk.ViTConfig:
    overrides = {f: getattr(args, f) for f in SHAPE_FLAGS if getattr(args, f) is not None}
    return dataclasses.replace(vk.get_config(args.variant), **overrides)


def model_from_arguments(args, **overrides) -> keras.Model:
    kwargs = dict(image_size=args.image_size, num_classes=args.num_classes,
                  classifier=args.classifier or "token", posemb=args.posemb or "learned",
                  representation_size=args.representation_size,
                  approximate_gelu=not args.exact_gelu, attention_kernel=args.attention_kernel)
    if args.family:  # the head follows --num-classes and the app, not the release
        kwargs.update(pretrained.PRETRAINED[args.family].architecture)
    return vk.vit(model_config(args), **{**kwargs, **overrides})


def add_data_arguments(parser: argparse.ArgumentParser, what: str,
                       dataset: str | None = "fashion_mnist"):
    """--dataset, --folder, --data-dir: where `what` comes from (vit_keras.data.load_source)."""
    group = parser.add_argument_group("data")
    group.add_argument("--dataset", default=dataset,
                       help=f"{what}: fashion_mnist (offline IDX files) or any tfds name")
    group.add_argument("--folder", help=f"{what} from DIR/<class>/<images> instead")
    group.add_argument("--data-dir", help="tfds data_dir, or where the Fashion-MNIST IDX files "
                                          "are")
    return group
