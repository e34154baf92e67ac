"""The ViT variants as one table of data, the parser that turns "B/16" into a config, and the
naming that ties model layers to the official checkpoint tree (the bottom of the import graph)."""

from __future__ import annotations

import dataclasses
import re


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """The shape of a Vision Transformer: everything that fixes its parameter count, and
    nothing else (dropout, position embeddings and the families' options are vk.vit's
    arguments). vk.VARIANTS holds the paper's; any other shape is a ViTConfig of its own.

    Args:
        hidden_size: the token width D.
        num_layers: the encoder blocks.
        num_heads: the attention heads; they divide hidden_size.
        mlp_dim: the MLP's hidden width.
        patch_size: the side of a square patch in pixels, or in the ResNet's feature map's
            cells for a hybrid.
        resnet_layers: None for a plain ViT; for a hybrid, the bottleneck units of each
            ResNet stage after the stem (an empty tuple: the stem alone).
        resnet_width: a hybrid's ResNet width (the stem's channels).

    Raises:
        ValueError: a size that is not a positive int, num_heads not dividing hidden_size,
            or resnet_layers not a tuple of positive ints.
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    patch_size: int
    resnet_layers: tuple[int, ...] | None = None
    resnet_width: int = 64

    def __post_init__(self):
        for name in ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size",
                     "resnet_width"):
            value = getattr(self, name)
            if not _is_positive_int(value):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads {self.num_heads} does not divide hidden_size {self.hidden_size}"
            )
        if self.resnet_layers is not None:
            layers = self.resnet_layers
            if not isinstance(layers, list | tuple) or not all(map(_is_positive_int, layers)):
                raise ValueError("resnet_layers must be None or a tuple of positive ints (units "
                                 f"per ResNet stage), got {layers!r}")
            object.__setattr__(self, "resnet_layers", tuple(layers))  # lists from JSON/dicts

    @property
    def head_dim(self) -> int:
        """Each attention head's width."""
        return self.hidden_size // self.num_heads

    @property
    def is_hybrid(self) -> bool:
        """Whether a ResNet stem comes before the patch embedding."""
        return self.resnet_layers is not None

    @property
    def stem_stride(self) -> int:
        """How much the ResNet shrinks the image: 4 for its root, 2 more per later stage."""
        if self.resnet_layers is None:
            return 1
        return 4 * 2 ** max(len(self.resnet_layers) - 1, 0)

    @property
    def cell_size(self) -> int:
        """Pixels per token along each side of the image (the patch size of a plain ViT)."""
        return self.stem_stride * self.patch_size


# Model sizes from the paper (Table 1) and the official configs (Ti and S from AugReg).
SIZES = {
    "Ti": dict(hidden_size=192, num_layers=12, num_heads=3, mlp_dim=768),
    "S": dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536),
    "B": dict(hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072),
    "L": dict(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096),
    "H": dict(hidden_size=1280, num_layers=32, num_heads=16, mlp_dim=5120),
}

# The variants with official checkpoints; any other "{size}/{patch}" also parses.
OFFICIAL = ("Ti/16", "S/16", "S/32", "B/16", "B/32", "B/8", "L/16", "L/32", "H/14")


# The paper's hybrids (vit_jax configs): ResNet units per stage, then the patch size on the
# ResNet's feature map. "R+Ti/16" keeps its official name although stem (/4) x 8x8 patches
# make 32-pixel cells, as in the official code.
HYBRID_SHAPES = {
    "R+Ti/16": ((), 8),
    "R26+S/32": ((2, 2, 2, 2), 1),
    "R26+B/32": ((2, 2, 2, 2), 1),
    "R50+B/16": ((3, 4, 9), 1),
    "R50+L/32": ((3, 4, 6, 3), 1),
}


def parse_variant(name: str) -> ViTConfig:
    """'B/16' -> ViTConfig of ViT-Base with 16x16 patches; 'R50+B/16' -> the hybrid."""
    if isinstance(name, str) and name in HYBRID_SHAPES:
        resnet_layers, patch = HYBRID_SHAPES[name]
        size = name.partition("+")[2].partition("/")[0]
        return ViTConfig(patch_size=patch, resnet_layers=resnet_layers, **SIZES[size])
    size, sep, patch = name.partition("/") if isinstance(name, str) else ("", "", "")
    if not sep or size not in SIZES or not patch.isdigit() or int(patch) < 1:
        raise ValueError(
            f"unknown variant {name!r}: expected '{{size}}/{{patch}}' with size one of "
            f"{sorted(SIZES)} or a hybrid (known variants: {', '.join(OFFICIAL)}, "
            f"{', '.join(HYBRID_SHAPES)})"
        )
    return ViTConfig(patch_size=int(patch), **SIZES[size])


VARIANTS: dict[str, ViTConfig] = {name: parse_variant(name)
                                   for name in (*OFFICIAL, *HYBRID_SHAPES)}
"""The variants with official checkpoints and the paper's hybrids, by name ("Ti/16",
"B/16", "R50+B/16", ...). Any "{size}/{patch}" with size Ti, S, B, L or H parses too."""


def variant_name(config: ViTConfig) -> str | None:
    """The name that parses to this shape ("Ti/16", "B/14", "R50+B/16"); None for a custom
    shape."""
    known = next((name for name, variant in VARIANTS.items() if variant == config), None)
    if known or config.is_hybrid:
        return known
    size = next((size for size, fields in SIZES.items()
                 if all(getattr(config, k) == v for k, v in fields.items())), None)
    return f"{size}/{config.patch_size}" if size else None


def get_config(variant: str | ViTConfig | dict) -> ViTConfig:
    """The ViTConfig of a variant, however it is given: every function that takes a
    variant accepts these three forms.

    Args:
        variant: a name ("B/16", any "{size}/{patch}" with size Ti, S, B, L or H, or a
            hybrid in vk.VARIANTS such as "R50+B/16"), a ViTConfig (returned as it is), or a
            dict of ViTConfig's fields for a custom shape.

    Returns:
        The ViTConfig.

    Raises:
        ValueError: an unknown name, or fields that make no valid shape.
    """
    if isinstance(variant, ViTConfig):
        return variant
    if isinstance(variant, dict):
        return ViTConfig(**variant)
    return parse_variant(variant)


def as_pair(value, what: str) -> tuple[int, int]:
    """An int or (height, width) as a pair of positive ints; `what` names it in the error."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"{what} must be a positive int or (height, width), got {value!r}")
    return pair


# Layer names of vit(): the official checkpoint tree, with '_' where Keras forbids '/'.
EMBEDDING = "embedding"
CLASS_TOKEN = "cls"
POSITION_EMBEDDING = "Transformer_posembed_input"
ENCODER_NORM = "Transformer_encoder_norm"
POOL = "pool"
# How a position-embedding table is fitted to another grid (vit_keras.weights.resample).
RESAMPLING_METHODS = ("zoom", "bilinear")
PRE_LOGITS = "pre_logits"
HEAD = "head"
# Layers of the options after the paper (vk.vit's docstring).
DISTILLATION_TOKEN = "dist_token"
REGISTERS = "registers"
PRE_NORM = "Transformer_pre_norm"
FC_NORM = "fc_norm"
HEAD_DIST = "head_dist"
POOL_DIST = "pool_dist"
PATCH_DROPOUT = "patch_dropout"


BLOCK_PREFIX = "Transformer_encoderblock_"


def block_name(index: int) -> str:
    return f"{BLOCK_PREFIX}{index}"


def checkpoint_name(layer_name: str) -> str:
    """A layer's scope in the checkpoint tree: Keras forbids '/' in layer names, so ours use
    '_' after 'Transformer' and between a ResNet stage and its unit instead."""
    prefix = "Transformer_"
    if layer_name.startswith(prefix):
        return "Transformer/" + layer_name[len(prefix):]
    return re.sub(r"^(block\d+)_(unit\d+)$", r"\1/\2", layer_name)


def _resnet_parameter_count(config: ViTConfig) -> tuple[int, int]:
    """(parameters, output channels) of a hybrid's ResNet (vit_keras.resnet): bias-free
    convolutions, a GroupNorm scale and bias after each, a projection where a unit changes the
    shape."""
    width = config.resnet_width
    count, channels = 7 * 7 * 3 * width + 2 * width, width  # conv_root, gn_root
    for stage, units in enumerate(config.resnet_layers):
        features = width * 2**stage
        for unit in range(units):
            count += (channels * features + 2 * features + 9 * features * features
                      + 2 * features + features * 4 * features + 2 * 4 * features)
            if channels != 4 * features or (stage > 0 and unit == 0):
                count += channels * 4 * features + 2 * 4 * features  # conv_proj, gn_proj
            channels = 4 * features
    return count, channels


def parameter_count(variant: str | ViTConfig | dict, image_size=224,
                    num_classes: int = 1000) -> int:
    """The parameters of the paper's model (class token, learned position embedding, no
    pre_logits) counted from its shape, without building it: what vk.vit(variant, image_size,
    num_classes).count_params() gives."""
    config = get_config(variant)
    height, width = as_pair(image_size, "image_size")
    if height % config.cell_size or width % config.cell_size:
        raise ValueError(f"image_size {height}x{width} is not divisible by the "
                         f"{config.cell_size}-pixel cells of {variant!r}")
    hidden, mlp = config.hidden_size, config.mlp_dim
    stem, channels = _resnet_parameter_count(config) if config.is_hybrid else (0, 3)
    tokens = (height // config.cell_size) * (width // config.cell_size) + 1
    embedding = config.patch_size**2 * channels * hidden + hidden
    block = (2 * 2 * hidden  # two LayerNorms
             + 4 * (hidden * hidden + hidden)  # query, key, value and output projections
             + hidden * mlp + mlp + mlp * hidden + hidden)
    return (stem + embedding + hidden + tokens * hidden + config.num_layers * block
            + 2 * hidden + hidden * num_classes + num_classes)
