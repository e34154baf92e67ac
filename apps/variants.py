"""Prints the table of variants and hybrids with their parameter counts, counted from their
shapes.

vit-keras variants [--image-size 224] [--num-classes 1000] [--pretrained]
"""

from .common import app_parser, positive_int, run


def variant_table(image_size: int = 224, num_classes: int = 1000) -> str:
    from vit_keras.configs import VARIANTS, parameter_count

    rows = ["| variant | layers | hidden D | MLP | heads | patch | parameters |",
            "|---|---|---|---|---|---|---|"]
    for name, config in VARIANTS.items():
        params = parameter_count(name, image_size, num_classes)
        patch = str(config.patch_size)
        if config.is_hybrid:
            stages = ",".join(map(str, config.resnet_layers)) or "root only"
            patch += f" on ResNet ({stages}) map, /{config.cell_size} cells"
        rows.append(f"| {name} | {config.num_layers} | {config.hidden_size} | {config.mlp_dim} "
                    f"| {config.num_heads} | {patch} | {params:,} |")
    return "\n".join(rows)


def pretrained_table() -> str:
    """The model cards of the named releases as one Markdown table, from their Release
    records (vit_keras.weights.pretrained), so that the page cannot drift from the code:
    what the weights are, their training data, variants, resolution, head, input
    convention, the ImageNet-1k top-1 their publisher reports with its source, the vk.vit
    options they need and their licence.

    Returns:
        The table, one row per release in name order.
    """
    from vit_keras.weights import pretrained

    rows = ["| name | weights | trained on | variants | px | classes | input | ImageNet-1k "
            "top-1 (%) | vk.vit options | licence |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in pretrained.names():
        release = pretrained.PRETRAINED[name]
        first = next(iter(release.checkpoints.values()))
        options = ", ".join(f"`{k}={v!r}`" for k, v in release.options.items()) or "-"
        rows.append(f"| `{name}` | {release.description} | {release.data} | "
                    f"{', '.join(release.checkpoints)} | {first.resolution} | "
                    f"{release.num_classes or 'no head'} | {release.convention.name} | "
                    f"{_top1_cell(release.top1)} | {options} | {release.licence} |")
    return "\n".join(rows)


def _top1_cell(top1) -> str:
    """"S/16 81.4, B/16 83.8 (head; [source](...))", or "-" where none is reported."""
    if top1 is None:
        return "-"
    values = ", ".join(f"{variant} {_percent(value)}" for variant, value in top1.values.items())
    return f"{values} ({top1.measure}; {top1.source})"


def _percent(value: float) -> str:
    """87.0 -> "87.0", 78.22 -> "78.22": the source's digits, at least one decimal."""
    text = f"{value:g}"
    return text if "." in text else f"{text}.0"


def main(argv=None):
    parser = app_parser("variants", __doc__)
    parser.add_argument("--image-size", type=positive_int, default=224,
                        help="image size the parameter counts are for")
    parser.add_argument("--num-classes", type=positive_int, default=1000,
                        help="classes of the head the counts include")
    parser.add_argument("--pretrained", action="store_true",
                        help="print the table of named pre-trained checkpoints instead")
    args = parser.parse_args(argv)
    print(pretrained_table() if args.pretrained else variant_table(args.image_size,
                                                                   args.num_classes))


if __name__ == "__main__":
    run(main)
