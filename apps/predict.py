"""Prints the top-k labels with probabilities for image files (or every image in a folder),
with a .keras model or any export: SavedModel folder, .tflite or .onnx.

vit-keras predict runs/fashion_mnist/model.keras shoe.png bag.jpg [--top-k 3]
vit-keras predict savedmodels/fashion_mnist/model_int8.tflite shoe.png
vit-keras predict augreg_in21k_ft_in1k --variant B/16 photo.jpg
vit-keras predict runs/fashion_mnist/model.keras shoe.png --merge-tokens 8
Labels come from labels.txt beside the model unless --labels names another file; either must
hold one name per class of the model.
A pre-trained release name (vit-keras variants --pretrained lists them) in place of a model
builds vk.vit(VARIANT, weights=NAME), downloaded once into the Keras cache, scales the images
as those weights expect and names ImageNet's classes (vk.decode_predictions); an existing file
or folder of that name wins over the release.
A token budget (--merge-tokens, --prune-tokens) applies to a .keras model or a release; an
export computes the budget it was exported with (vit-keras export --merge-tokens).
"""

import os

from .common import (
    LABELS_FILE,
    add_token_budget_arguments,
    app_parser,
    asks_token_budget,
    beside_model,
    check_token_budget,
    image_paths,
    load_model,
    positive_int,
    run,
    with_token_budget,
)


def read_labels(path: str, count: int, given: bool) -> list[str]:
    """The names in `path`, which must be one per class; the class numbers, said so, when a
    file that was not given by name does not exist."""
    if not given and not os.path.exists(path):
        print("classes by number: no labels.txt beside the model (--labels FILE names them)")
        return [str(i) for i in range(count)]
    if not os.path.exists(path):
        raise FileNotFoundError(f"labels file {path!r} does not exist")
    with open(path) as file:
        names = file.read().splitlines()
    if len(names) != count:
        raise ValueError(f"labels file {path!r} has {len(names)} names but the model has "
                         f"{count} classes: pass the labels of the model's training run")
    return names


def main(argv=None):
    parser = app_parser("predict", __doc__)
    parser.add_argument("model", help="a .keras file, SavedModel folder, .tflite or .onnx, or "
                                       "a pre-trained release name (an existing path wins)")
    parser.add_argument("images", nargs="+", help="image files or folders")
    parser.add_argument("--variant", help="the release's checkpoint to run, e.g. Ti/16, where "
                                          "the model is a release name")
    parser.add_argument("--top-k", type=positive_int, default=3,
                        help="how many labels to print per image")
    parser.add_argument("--labels", help="one class name a line (default: labels.txt beside "
                                         "the model)")
    parser.add_argument("--image-size", type=positive_int, nargs=2, metavar=("HEIGHT", "WIDTH"),
                        help="the size images are resized to, for a model that takes any size "
                             "(default: the model's own input size)")
    add_token_budget_arguments(parser, "a .keras model or a release before it predicts")
    args = parser.parse_args(argv)
    check_token_budget(args)
    import numpy as np

    from vit_keras import data
    from vit_keras.export import Predictor
    from vit_keras.export.runtimes import sides_text
    from vit_keras.weights import pretrained

    if not os.path.exists(args.model) and pretrained.is_name(args.model):
        return predict_release(args)
    if args.variant is not None:
        raise ValueError(f"--variant picks a pre-trained release's checkpoint, but "
                         f"{args.model!r} is a model on disk: leave --variant out")
    if not os.path.exists(args.model):
        raise FileNotFoundError(f"model {args.model!r} does not exist, nor is it a pre-trained "
                                f"release name ({', '.join(pretrained.names())})")
    model = Predictor(args.model, model=budget_model(args))
    paths = image_paths(args.images)
    *size, channels = model.input_shape
    if args.image_size is None and None in size:
        raise ValueError("the model takes images of any size: give --image-size HEIGHT WIDTH")
    if args.image_size is not None and not model.takes((*args.image_size, channels)):
        raise ValueError(f"--image-size: the model takes images of ({sides_text(size)}) "
                         f"pixels, got ({sides_text(args.image_size)})")
    size = args.image_size or size
    pixels = data.load_image_files(paths, tuple(size), channels)
    probabilities = model(pixels)["probabilities"]
    labels = read_labels(args.labels or beside_model(args.model, LABELS_FILE),
                         probabilities.shape[-1], bool(args.labels))
    results = []
    for path, row in zip(paths, probabilities, strict=True):
        best = np.argsort(-row)[:args.top_k]
        results.append([(labels[i], float(row[i])) for i in best])
        print(f"{path}: " + ", ".join(f"{labels[i]} {row[i]:.3f}" for i in best))
    return results


def budget_model(args):
    """The .keras model with the token flags' budget, or None to run the file as it is;
    an export is refused (its budget was fixed when it was exported)."""
    if not asks_token_budget(args):
        return None
    if not args.model.endswith(".keras"):
        raise ValueError(f"a token budget applies to a .keras model or a release, not to the "
                         f"export {args.model!r}: export the .keras model with it (vit-keras "
                         f"export --merge-tokens R or --prune-tokens KEEP)")
    return with_token_budget(args, load_model(args.model))


def predict_release(args) -> list:
    """The top-k ImageNet classes of each image by a release's model, built as vk.vit builds
    it from the name, preprocessed as its weights expect (the README's first example)."""
    import vit_keras as vk
    from vit_keras import data
    from vit_keras.weights import labels, pretrained

    release = pretrained.PRETRAINED[args.model]
    if args.variant is None:
        raise ValueError(f"{args.model!r} is a pre-trained release: give --variant, one of "
                         f"{', '.join(release.checkpoints)}")
    if args.labels or args.image_size:
        raise ValueError(f"{'--labels' if args.labels else '--image-size'} is for a model file: "
                         f"release {args.model!r} names its own classes at its own size")
    labels.release_label_set(args.model)  # CLIP's projection or no head: refused unfetched
    entry = pretrained.checkpoint(args.variant, args.model)
    paths = image_paths(args.images)
    model = with_token_budget(args, vk.vit(args.variant, weights=args.model,
                                           **pretrained.vit_kwargs(args.model, args.variant)))
    pixels = data.load_image_files(paths, entry.resolution)
    logits = model.predict(vk.preprocess(pixels, model), verbose=0)
    results = vk.decode_predictions(logits, top=args.top_k, model=model)
    for path, best in zip(paths, results, strict=True):
        print(f"{path}:")
        for synset, name, probability in best:
            print(f"  {probability:.1%} {name} ({synset})")
    return results


if __name__ == "__main__":
    run(main)
