"""Evaluates a saved model (.keras) on a held-out set: top-1, top-5, per-class accuracy and a
confusion matrix saved as PNG, all written to --out as well as printed. Images are normalised
by the model's input convention: [-1, 1], or the mean and standard deviation of the release
its weights came from (vk.input_convention).

vit-keras evaluate runs/fashion_mnist/model.keras [--dataset fashion_mnist | --folder DIR]
                   [--limit N] [--mirror] [--merge-tokens R | --prune-tokens KEEP]

With a token budget, evaluation.json records it ("token_budget").
"""

import json
import os

from .common import (
    add_data_arguments,
    add_token_budget_arguments,
    app_parser,
    beside_model,
    check_token_budget,
    load_model,
    positive_int,
    run,
    with_token_budget,
)


def main(argv=None):
    parser = app_parser("evaluate", __doc__)
    parser.add_argument("model", help="a .keras file")
    add_data_arguments(parser, "held-out images").add_argument(
        "--split", default="test", help="tfds split (or Fashion-MNIST's train / test)")
    parser.add_argument("--limit", type=positive_int,
                        help="evaluate the first N held-out images only (a quick check)")
    parser.add_argument("--batch-size", type=positive_int, default=256,
                        help="images per forward pass")
    parser.add_argument("--quantize", choices=["int8", "float8", "int4"],
                        help="evaluate the model quantized with Keras' model.quantize "
                             "(every dense kernel)")
    parser.add_argument("--mirror", action="store_true",
                        help="average each image's logits with its mirror's (test-time flip, "
                             "as the fashion_mnist recipe evaluates)")
    parser.add_argument("--out", help="folder for evaluation.json and confusion_matrix.png "
                                      "(default: beside the model)")
    add_token_budget_arguments(parser, "the model before it is evaluated")
    args = parser.parse_args(argv)
    check_token_budget(args)
    from vit_keras import data, evaluation, intermediates
    from vit_keras.preprocessing import feeding, input_convention
    from vit_keras.tokens.budget import token_budget

    model = load_model(args.model)
    if args.quantize:
        model.quantize(args.quantize)
    model = with_token_budget(args, model)
    dataset, names = data.load_source(args.dataset, args.split, args.folder, args.data_dir)
    num_classes = model.outputs[0].shape[-1]
    if names and len(names) != num_classes:
        raise ValueError(f"{args.folder or args.dataset!r} has {len(names)} classes "
                         f"({', '.join(names)}), but the model predicts {num_classes}")
    names = names or [str(i) for i in range(num_classes)]
    if args.limit:
        dataset = dataset.take(args.limit)
    convention = input_convention(model)  # [-1, 1] unless the model records another
    batches = data.make_pipeline(dataset, image_size=intermediates.built_image_size(model),
                                 num_classes=num_classes, batch_size=args.batch_size,
                                 training=False, channels=model.input.shape[-1],
                                 convention=feeding(model))
    report = evaluation.classification_report(
        *evaluation.predict_labels(model, batches, mirror=args.mirror), names)
    report.update(quantization=args.quantize, mirror=args.mirror,
                  input_convention=convention.name, token_budget=token_budget(model))
    out = args.out or beside_model(args.model)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "evaluation.json"), "w") as file:
        json.dump(report, file, indent=1)
    evaluation.save_confusion_matrix(report["confusion_matrix"], names,
                                     os.path.join(out, "confusion_matrix.png"))
    print(f"{report['images']} images: top-1 {report['top1']:.4f}, top-5 {report['top5']:.4f}")
    for name, accuracy in report["per_class"].items():
        print(f"  {name:>14}: {accuracy:.4f}")
    print(f"wrote {os.path.join(out, 'evaluation.json')} and confusion_matrix.png")
    return report


if __name__ == "__main__":
    run(main)
