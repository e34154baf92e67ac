"""Command-line pieces the apps share: describing a model and a data source with flags."""

import argparse
import dataclasses

import keras

import vit_keras as vk
from vit_keras import kernels
from vit_keras.models import CLASSIFIERS
from vit_keras.position_embeddings import POSITION_EMBEDDINGS

SHAPE_FLAGS = ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size")


def add_model_arguments(parser: argparse.ArgumentParser, variant: str | None = "B/16",
                        image_size: int | None = 224, num_classes: int = 1000) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--variant", default=variant, help=f"e.g. Ti/16, B/16 (default {variant})")
    for flag in SHAPE_FLAGS:
        group.add_argument("--" + flag.replace("_", "-"), type=int, default=None,
                           help="override the variant's value (custom shapes)")
    group.add_argument("--image-size", type=int, default=image_size)
    group.add_argument("--num-classes", type=int, default=num_classes)
    group.add_argument("--classifier", default=None, choices=CLASSIFIERS,
                       help=f"default {CLASSIFIERS[0]}")
    group.add_argument("--posemb", default=None, choices=list(POSITION_EMBEDDINGS),
                       help="position embedding (default learned)")
    group.add_argument("--representation-size", type=int, default=None)
    group.add_argument("--exact-gelu", action="store_true",
                       help="erf GELU (timm / Hugging Face weights) instead of the tanh one")
    group.add_argument("--attention-kernel", default="auto", choices=kernels.ATTENTION_KERNELS,
                       help="how attention is computed (vit_keras.kernels; default auto)")


def model_config(args) -> vk.ViTConfig:
    overrides = {f: getattr(args, f) for f in SHAPE_FLAGS if getattr(args, f) is not None}
    return dataclasses.replace(vk.get_config(args.variant), **overrides)


def model_from_arguments(args, **overrides) -> keras.Model:
    kwargs = dict(image_size=args.image_size, num_classes=args.num_classes,
                  classifier=args.classifier or "token", posemb=args.posemb or "learned",
                  representation_size=args.representation_size,
                  approximate_gelu=not args.exact_gelu, attention_kernel=args.attention_kernel)
    return vk.vit(model_config(args), **{**kwargs, **overrides})


def add_data_arguments(parser: argparse.ArgumentParser, what: str):
    """--dataset, --folder, --data-dir: where `what` comes from (vit_keras.data.load_source)."""
    group = parser.add_argument_group("data")
    group.add_argument("--dataset", default="fashion_mnist",
                       help=f"{what}: fashion_mnist (offline IDX files) or any tfds name "
                            "(default fashion_mnist)")
    group.add_argument("--folder", help=f"{what} from DIR/<class>/<images> instead")
    group.add_argument("--data-dir", help="tfds data_dir, or where the Fashion-MNIST IDX files "
                                          "are")
    return group
