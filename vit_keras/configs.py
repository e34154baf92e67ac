"""The ViT variants as one table of data, and the parser that turns "B/16" into a config."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Shape of a Vision Transformer: everything that fixes its parameter count."""

    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    patch_size: int

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field.name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads {self.num_heads} does not divide hidden_size {self.hidden_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


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


def parse_variant(name: str) -> ViTConfig:
    """'B/16' -> ViTConfig of ViT-Base with 16x16 patches."""
    size, sep, patch = name.partition("/") if isinstance(name, str) else ("", "", "")
    if not sep or size not in SIZES or not patch.isdigit() or int(patch) < 1:
        raise ValueError(
            f"unknown variant {name!r}: expected '{{size}}/{{patch}}' with size one of "
            f"{sorted(SIZES)} (known variants: {', '.join(OFFICIAL)})"
        )
    return ViTConfig(patch_size=int(patch), **SIZES[size])


VARIANTS: dict[str, ViTConfig] = {name: parse_variant(name) for name in OFFICIAL}


def get_config(variant: str | ViTConfig | dict) -> ViTConfig:
    """Accept a variant name, a ViTConfig, or a dict of ViTConfig fields (custom shapes)."""
    if isinstance(variant, ViTConfig):
        return variant
    if isinstance(variant, dict):
        return ViTConfig(**variant)
    return parse_variant(variant)
