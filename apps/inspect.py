"""Draws the paper's inspection figures for a model: attention rollout next to its images
(Figure 6), patch-embedding filters, position-embedding similarity and mean attention distance
against depth (Figure 7), and writes the numbers as JSON.

vit-keras inspect runs/fashion_mnist/model.keras [photo.png ...] [--out DIR]
"""

import json
import os

import matplotlib
import numpy as np

from .common import (
    add_data_arguments,
    app_parser,
    beside_model,
    image_paths,
    load_model,
    positive_int,
    run,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save(figure, path):
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def rollout_figure(images, maps, path):
    figure, axes = plt.subplots(2, len(images), figsize=(2 * len(images), 4), squeeze=False)
    for i, (image, heat) in enumerate(zip(images, maps, strict=True)):
        axes[0, i].imshow(image.squeeze(), cmap="gray" if image.shape[-1] == 1 else None)
        axes[1, i].imshow(image.mean(axis=-1), cmap="gray")
        axes[1, i].imshow(heat, cmap="inferno", alpha=0.6, interpolation="bilinear",
                          extent=(0, image.shape[1], image.shape[0], 0))
        for row in (0, 1):
            axes[row, i].axis("off")
    axes[0, 0].set_title("input", loc="left")
    axes[1, 0].set_title("attention rollout", loc="left")
    save(figure, path)


def filters_figure(filters, path):
    columns = 7
    rows = int(np.ceil(len(filters) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(columns, rows), squeeze=False)
    for axis in axes.ravel():
        axis.axis("off")
    for axis, image in zip(axes.ravel(), filters, strict=False):
        axis.imshow(image.squeeze(), cmap="gray" if image.shape[-1] == 1 else None)
    figure.suptitle("principal components of the patch-embedding filters")
    save(figure, path)


def similarity_figure(similarity, path):
    rows, cols = similarity.shape[:2]
    figure, axes = plt.subplots(rows, cols, figsize=(cols, rows), squeeze=False)
    for r in range(rows):
        for c in range(cols):
            axes[r, c].imshow(similarity[r, c], vmin=-1, vmax=1, cmap="viridis")
            axes[r, c].axis("off")
    figure.suptitle("position-embedding cosine similarity")
    save(figure, path)


def distance_figure(distances, path):
    figure, axis = plt.subplots(figsize=(5, 4))
    for head in range(distances.shape[1]):
        axis.scatter(np.arange(len(distances)), distances[:, head], s=12)
    axis.set_xticks(range(len(distances)))
    axis.set_xlabel("network depth (layer)")
    axis.set_ylabel("mean attention distance (pixels)")
    save(figure, path)


def build_parser():
    parser = app_parser("inspect", __doc__)
    parser.add_argument("model", help="a .keras file")
    parser.add_argument("images", nargs="*",
                        help="image files to draw (PNG, JPEG, any size; resized to the model's "
                             "input); default: images of --dataset / --folder")
    parser.add_argument("--out", help="output folder, which must not hold files yet unless "
                                      "--overwrite (default: inspect/ beside the model)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an output folder that holds files already")
    parser.add_argument("--images", dest="count", type=positive_int, default=6,
                        help="how many dataset images to draw")
    parser.add_argument("--distance-images", type=positive_int, default=64,
                        help="dataset images the mean attention distance averages over")
    add_data_arguments(parser, "images to draw when no files are given")
    return parser


def output_folder(args) -> str:
    out = args.out or beside_model(args.model, "inspect")
    if os.path.isdir(out) and os.listdir(out) and not args.overwrite:
        raise FileExistsError(f"output folder {out!r} holds files already; pass --overwrite "
                              "or another --out")
    os.makedirs(out, exist_ok=True)
    return out


def input_pixels(args, model, files):
    """(images to draw, images for the attention distance), uint8 at the model's size: the
    image files given, else images of the dataset."""
    from vit_keras import data, intermediates

    size, channels = intermediates.built_image_size(model), model.input.shape[-1]
    if files:
        pixels = data.load_image_files(files, size, channels)
        return pixels, pixels
    dataset, _ = data.load_source(args.dataset, "test", args.folder, args.data_dir)
    pixels = data.sample_images(dataset, size, channels, max(args.count, args.distance_images))
    return pixels[:args.count], pixels[:args.distance_images]


def main(argv=None):
    args = build_parser().parse_args(argv)
    files = image_paths(args.images) if args.images else None  # checked before the model loads
    from vit_keras import analysis
    from vit_keras.preprocessing import preprocess

    model = load_model(args.model)
    shown, measured = input_pixels(args, model, files)
    out = output_folder(args)
    maps = analysis.attention_rollout(model, preprocess(shown, model))
    distances = analysis.mean_attention_distance(model, preprocess(measured, model))
    numbers = {"mean_attention_distance": distances.round(3).tolist()}
    figures = {"rollout.png": lambda path: rollout_figure(shown, maps, path),
               "attention_distance.png": lambda path: distance_figure(distances, path),
               # hybrids have no image-patch filters; posemb="none" has no similarity
               "filters.png": lambda path: filters_figure(analysis.patch_filters(model), path),
               "posemb_similarity.png": lambda path: similarity_figure(
                   analysis.position_embedding_similarity(model), path)}
    written = []
    for name, draw in figures.items():
        path = os.path.join(out, name)
        if os.path.exists(path):  # an earlier inspect's, which this model may not draw again
            os.remove(path)
        try:
            draw(path)
            written.append(name)
        except ValueError as err:
            numbers[name.removesuffix(".png")] = str(err)
            print(f"no {name}: {err}")
    with open(os.path.join(out, "inspect.json"), "w") as file:
        json.dump(numbers, file, indent=1)
    print(f"wrote {', '.join(written)} and inspect.json to {out}")
    return out


if __name__ == "__main__":
    run(main)
