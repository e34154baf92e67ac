"""Command-line pieces the apps share: the parser, running with clear errors, describing a
model and a data source with flags, reading a saved model.

Building a parser imports neither Keras nor TensorFlow, so --help answers at once; the apps
import the library inside the functions that use it, once their arguments are parsed."""

import argparse
import dataclasses
import os
import pathlib
import sys
import textwrap
import traceback
import warnings
import zipfile

SHAPE_FLAGS = ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size")
# --resnet-layers' word for a plain ViT (no ResNet), and for a hybrid of the ResNet's stem alone.
NO_RESNET, STEM_ONLY = "none", "stem"
# How the usage line names a program; the console script sets "vit-keras {name}".
PROG = "python -m apps.{name}"
# The class names a training run writes beside its model, one a line, which export and predict
# read from there (vit_keras.export.LABELS_FILE); and its results, the data it read among them.
LABELS_FILE, RESULT_FILE = "labels.txt", "result.json"
# A user's mistake: reported in one line, without a traceback (--debug shows it); an export
# that fails its verification is one too (user_errors).
USER_ERRORS = (ValueError, OSError, zipfile.BadZipFile)

# The library's names for what some flags choose from, spelled here so that a parser needs no
# Keras; tests/test_cli.py checks each against the library's own table.
CLASSIFIERS = ("token", "gap")  # vit_keras.models.CLASSIFIERS
POSITION_EMBEDDINGS = ("learned", "learned2d", "sincos2d", "none",
                       "relative")  # position_embeddings.POSITION_EMBEDDINGS
ATTENTION_KERNELS = ("auto", "fused", "einsum")  # kernels.ATTENTION_KERNELS
BACKENDS = ("tensorflow", "jax", "torch")  # the Keras backends the library runs on
RECIPES = ("fashion_mnist", "finetune", "mpp", "pretrain", "scratch")  # training.RECIPES
LORA_TARGETS = ("query", "key", "value", "out", "Dense_0", "Dense_1")  # lora.TARGETS
DISTRIBUTIONS = ("auto", "none", "tpu", "mirrored", "multiworker", "data-parallel",
                 "model-parallel")  # distribute.KINDS
EXPORT_FORMATS = ("saved_model", "tflite_float32", "tflite_float16", "tflite_dynamic_int8",
                  "tflite_int8", "onnx")  # export.formats.FORMATS
MASKED_TARGETS = ("mean_color", "downsized", "pixels")  # masked.TARGETS


class HelpFormatter(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each flag's default after its help, unless the
    help names it already or there is none (None, a switch's False, an empty list)."""

    def _get_help_string(self, action):
        default = action.default
        if "default" in (action.help or "").lower() or default is None or default is False \
                or default == []:
            return action.help
        return super()._get_help_string(action)


class AppParser(argparse.ArgumentParser):
    """Imports Keras and TensorFlow once the arguments are parsed (import_keras), so that
    --help and a mistaken flag answer without them."""

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        import_keras(verbose=parsed.verbose)
        return parsed

    def error(self, message):
        """A mistaken flag in one line, as the apps' other mistakes, without the usage block
        (argparse's) that can run to dozens of lines."""
        self.exit(2, f"{self.prog}: error: {message}; --help lists the flags\n")


def import_keras(verbose: bool) -> None:
    """Imports vit_keras, which loads what must come before TensorFlow (Triton's library, and
    Keras with its PyTorch backend's compiler, which crash the process when loaded after
    TensorFlow), then TensorFlow itself. TensorFlow's start-up log lines are silenced unless
    --verbose (or TF_CPP_MIN_LOG_LEVEL is set already); some of them (oneDNN's, on CPUs with
    AVX-512) come before TensorFlow reads its log level, so the imports run with the process's
    stderr closed."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend and backend not in BACKENDS:  # Keras takes an empty one for unset
        raise ValueError(f"KERAS_BACKEND={backend!r}: expected one of {', '.join(BACKENDS)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")
    if verbose or "tensorflow" in sys.modules:
        return
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import vit_keras  # noqa: F401

        # isort: split
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def app_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """A parser whose --help prints the app's whole docstring and every flag's default."""
    parser = AppParser(prog=PROG.format(name=name), description=doc,
                       formatter_class=HelpFormatter)
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback when something goes wrong")
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's start-up and runtime log lines")
    return parser


def run(main, argv=None):
    """main(argv), with a user's mistake reported in one line on stderr and exit status 2, and
    warnings in one line each; --debug shows the traceback and the warnings' source lines."""
    argv = sys.argv[1:] if argv is None else list(argv)
    formatwarning = warnings.formatwarning
    if "--debug" not in argv:
        warnings.formatwarning = one_line_warning
    try:
        return main(argv)
    except Exception as err:
        if not isinstance(err, user_errors()):
            raise
        if "--debug" in argv:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        warnings.formatwarning = formatwarning


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the apps print it: its message, without the source line that raised it."""
    return f"warning: {message}\n"


def user_errors() -> tuple[type, ...]:
    """USER_ERRORS, and an export's failed verification once the export module is loaded (it
    is raised nowhere else)."""
    export = sys.modules.get("vit_keras.export")
    return USER_ERRORS + ((export.ExportVerificationError,) if export else ())


def beside_model(model_path: str, name: str = "") -> str:
    """The path of `name` in the model file's folder (the folder itself for no name): where a
    training run left its labels and results, and where the apps write theirs by default."""
    folder = os.path.dirname(os.path.abspath(model_path))
    return os.path.join(folder, name) if name else folder


def counted(number: int, noun: str) -> str:
    """"1 epoch", "8 epochs": a count and its noun, in the plural where it is not one."""
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"


def fit_progress() -> str | int:
    """model.fit's verbose for a training app: Keras' progress bar on a terminal, a summary
    line per epoch where the output is kept (a file, a pipe), which the bar's rewrites fill."""
    return "auto" if sys.stdout.isatty() else 2


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _whole_number(text, 1, "a positive whole number")


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return _whole_number(text, 0, "a whole number of at least 0")


def resnet_layers(text: str) -> tuple[int, ...] | str:
    """An argparse type: the hybrid's bottleneck units per ResNet stage ("3,4,9"), "stem" for
    the stem alone (()), or "none" for a plain ViT (kept as that word: None means not given)."""
    if text in (NO_RESNET, STEM_ONLY):
        return () if text == STEM_ONLY else NO_RESNET
    units = text.split(",")
    if not all(unit.strip().isdigit() and int(unit) > 0 for unit in units):
        raise argparse.ArgumentTypeError(
            f"expected '{NO_RESNET}', '{STEM_ONLY}' or positive whole numbers separated by "
            f"commas (units per ResNet stage, e.g. 3,4,9), got {text!r}")
    return tuple(int(unit) for unit in units)


def _whole_number(text: str, minimum: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def image_paths(inputs) -> list[str]:
    """The image files named, and those under each folder named, in order; a name that is
    neither gets one clear error."""
    from vit_keras import data

    paths = []
    for item in inputs:
        item = pathlib.Path(item)
        if item.is_dir():
            paths += sorted(str(p) for p in item.rglob("*") if p.suffix.lower()
                            in data.IMAGE_SUFFIXES)
        elif item.exists():
            paths.append(str(item))
        else:
            raise FileNotFoundError(f"no such image file or folder: {str(item)!r}")
    if not paths:
        raise ValueError("no image files given")
    return paths


def load_model(path: str):
    """A .keras file in safe mode; a missing file and an unreadable one are told apart."""
    from vit_keras.weights.files import load_model as read

    return read(path, compile=False)


def add_model_arguments(parser: argparse.ArgumentParser, without_variant: str,
                        image_size: int | None = 224, num_classes: int | None = 1000):
    """The model's flags, in a group that the function returns (for an app's own model
    flags); `without_variant` says what the model is when --variant is not given (with the
    defaults it implies)."""
    group = parser.add_argument_group("model", textwrap.fill(f"Without --variant: "
                                                             f"{without_variant}.", 80,
                                                             break_on_hyphens=False))
    group.add_argument("--variant", help="e.g. Ti/16, B/16, R50+B/16")
    for flag in SHAPE_FLAGS:
        group.add_argument("--" + flag.replace("_", "-"), type=positive_int, default=None,
                           help="override the variant's value (custom shapes)")
    group.add_argument("--resnet-layers", type=resnet_layers, default=None,
                       metavar=f"{NO_RESNET}|{STEM_ONLY}|N[,N...]",
                       help="make the model a hybrid (the paper's ResNet before the patches, "
                            "whose feature map --patch-size then cuts): bottleneck units per "
                            f"stage after the stem, '{STEM_ONLY}' for the stem alone, or "
                            f"'{NO_RESNET}' for a plain ViT")
    group.add_argument("--resnet-width", type=positive_int, default=None,
                       help="the hybrid ResNet's stem width (channels; 64 in the paper's)")
    group.add_argument("--image-size", type=positive_int, default=image_size,
                       help="image height and width in pixels")
    group.add_argument("--num-classes", type=positive_int, default=num_classes,
                       help="classes of the head (a dataset's own count wins where known)")
    group.add_argument("--classifier", default=None, choices=CLASSIFIERS,
                       help=f"how the head reads the tokens (default: {CLASSIFIERS[0]})")
    group.add_argument("--posemb", default=None, choices=POSITION_EMBEDDINGS,
                       help=f"position embedding (default: {POSITION_EMBEDDINGS[0]})")
    group.add_argument("--representation-size", type=positive_int, default=None,
                       help="width of the paper's tanh pre_logits layer (none if not given)")
    group.add_argument("--exact-gelu", action="store_true",
                       help="erf GELU (timm / Hugging Face weights) instead of the tanh one")
    group.add_argument("--attention-kernel", default="auto", choices=ATTENTION_KERNELS,
                       help="how attention is computed (vit_keras.kernels)")
    group.add_argument("--family", metavar="RELEASE", default=None,
                       help="build the model with the vk.vit options of this named release "
                            "(LayerScale, registers, CLIP's pre-norm, ...: vit-keras variants "
                            "--pretrained lists them), for its files and fine-tunes")
    return group


def model_config(args):
    """The vk.ViTConfig of --variant with the shape flags given."""
    import vit_keras as vk

    overrides = {f: getattr(args, f) for f in SHAPE_FLAGS if getattr(args, f) is not None}
    if args.resnet_width is not None:
        overrides["resnet_width"] = args.resnet_width
    if args.resnet_layers is not None:
        overrides["resnet_layers"] = (None if args.resnet_layers == NO_RESNET
                                      else tuple(args.resnet_layers))
    return dataclasses.replace(vk.get_config(args.variant), **overrides)


def model_from_arguments(args, **overrides):
    """vk.vit of the model flags; `overrides` are vk.vit's keywords that the app fixes."""
    import vit_keras as vk
    from vit_keras.weights import pretrained

    kwargs = dict(image_size=args.image_size, num_classes=args.num_classes,
                  classifier=args.classifier or CLASSIFIERS[0],
                  posemb=args.posemb or POSITION_EMBEDDINGS[0],
                  representation_size=args.representation_size,
                  approximate_gelu=not args.exact_gelu, attention_kernel=args.attention_kernel)
    if args.family:  # the head follows --num-classes and the app, not the release
        if not pretrained.is_name(args.family):
            raise ValueError(f"--family {args.family!r}: expected a named release, one of "
                             f"{', '.join(pretrained.names())}")
        kwargs.update(pretrained.PRETRAINED[args.family].architecture)
    weights = getattr(args, "weights", None)
    release = weights if pretrained.is_name(weights) else args.family
    if release:  # the model records its weights' input convention, which pipelines follow
        kwargs["input_convention"] = release
    return vk.vit(model_config(args), **{**kwargs, **overrides})


def keep_rate(text: str) -> float:
    """An argparse type: a share of the tokens, above 0 and at most 1."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share of the tokens in (0, 1], got "
                                         f"{text!r}")
    return value


def add_token_budget_arguments(parser: argparse.ArgumentParser, applied_to: str) -> None:
    """--merge-tokens, --prune-tokens (one or the other) and --prune-blocks: a token budget
    for the model, applied to `applied_to` (docs/tokens.md)."""
    group = parser.add_argument_group("token budget", textwrap.fill(
        f"Merge or prune tokens in {applied_to} (vk.merge_tokens, vk.prune_tokens; "
        "docs/tokens.md): one of the two.", 80, break_on_hyphens=False))
    methods = group.add_mutually_exclusive_group()
    methods.add_argument("--merge-tokens", type=non_negative_int, metavar="R",
                         help="merge R tokens away in every block (ToMe); 0 merges none")
    methods.add_argument("--prune-tokens", type=keep_rate, metavar="KEEP",
                         help="keep this share of the patch tokens at each pruning block, "
                              "fusing the rest into one (EViT), in (0, 1]; the model needs a "
                              "class token")
    group.add_argument("--prune-blocks", type=int, nargs="+", metavar="I",
                       help="the blocks that prune, 0-based, negative from the end (default: "
                            "a quarter, half and three quarters of the way through)")


def check_token_budget(args) -> None:
    """Refuses --prune-blocks without --prune-tokens, before anything is loaded."""
    if args.prune_blocks is not None and args.prune_tokens is None:
        raise ValueError("--prune-blocks chooses where --prune-tokens prunes: give "
                         "--prune-tokens KEEP too")


def with_token_budget(args, model):
    """model with the budget of the token flags (model itself without them), the flags
    checked by check_token_budget."""
    import vit_keras as vk

    if args.merge_tokens is not None:
        return vk.merge_tokens(model, args.merge_tokens)
    if args.prune_tokens is not None:
        return vk.prune_tokens(model, args.prune_tokens, blocks=args.prune_blocks)
    return model


def asks_token_budget(args) -> bool:
    """Whether a token flag is given."""
    return any(value is not None for value in
               (args.merge_tokens, args.prune_tokens, args.prune_blocks))


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
