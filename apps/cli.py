"""vit-keras: the apps as one installed command, `vit-keras NAME [flags]` for
`python -m apps.NAME [flags]` in a checkout."""

import importlib
import sys

from . import common

APPS = {"train": "train a ViT with a recipe and evaluate it (no flags: the reference run)",
        "finetune": "fine-tune a pre-trained checkpoint with the paper's recipe",
        "pretrain": "self-supervised pre-training by masked patch prediction (no labels)",
        "evaluate": "top-1, top-5, per-class accuracy and a confusion matrix",
        "predict": "top-k labels for image files, from a .keras model, any export or a release",
        "export": "SavedModel, TFLite and ONNX, each verified against the Keras model",
        "inspect": "the paper's attention and embedding figures for a model",
        "convert": "weights between .npz, .keras, .weights.h5 and timm / Hugging Face files",
        "variants": "the table of variants and pre-trained checkpoints"}


def usage() -> str:
    lines = ["usage: vit-keras NAME [flags]   (vit-keras NAME --help for its flags)", "",
             "The Vision Transformer (Dosovitskiy et al., ICLR 2021) for Keras 3.", ""]
    lines += [f"  {name:<10} {what}" for name, what in APPS.items()]
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        # asked for, on stdout; without an app name, a usage error, as argparse's
        print(usage(), file=sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name not in APPS:
        print(f"error: unknown command {name!r}: expected one of {', '.join(APPS)}",
              file=sys.stderr)
        raise SystemExit(2)
    common.PROG = "vit-keras {name}"
    app = importlib.import_module(f"{__package__}.{name}")
    common.run(app.main, rest)
