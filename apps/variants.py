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
    from vit_keras.weights import pretrained

    rows = ["| name | variants | resolution | classes | trained on | vk.vit options | licence |",
            "|---|---|---|---|---|---|---|"]
    for name in pretrained.names():
        release = pretrained.PRETRAINED[name]
        first = next(iter(release.checkpoints.values()))
        options = ", ".join(f"`{k}={v!r}`" for k, v in release.options.items()) or "-"
        rows.append(f"| `{name}` | {', '.join(release.checkpoints)} | {first.resolution} | "
                    f"{first.num_classes or 'no head'} | {release.description} | {options} | "
                    f"{release.licence} |")
    return "\n".join(rows)


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
