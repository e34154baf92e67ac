"""The paper's masked patch prediction experiment (Section 4.6) at Fashion-MNIST scale, with
the main job's model: pre-train on the training images without their labels, then fine-tune,
against training from scratch for as many epochs in all; and the linear probes of the
pre-trained representation against a randomly initialised one.

python -m benchmarks.masked_patch [--pretrain-epochs 3] [--finetune-epochs 3]
    [--out runs/mpp] [--limit N] [--recipe-option FIELD=VALUE ...]
    [--json docs/paper/masked_patch.json]

Runs under the current KERAS_BACKEND; --limit uses only N training images (a smoke run);
--recipe-option changes the supervised runs' recipe (fine-tuning and from scratch), as
vit-keras train's flag does.
"""

import argparse
import os

import keras
import numpy as np

import vit_keras as vk
from apps import finetune, pretrain, train
from benchmarks import limit_flags, write_json
from benchmarks.machine import describe_host
from vit_keras import analysis, data

PROBE_TRAIN, PROBE_TEST = 10_000, 10_000  # images of each split the probes see
SHOTS = (1, 5, 10, 25)


def representation_features(model: keras.Model, images: np.ndarray) -> np.ndarray:
    inputs = vk.preprocess(np.repeat(images, 3, axis=-1))
    return np.asarray(analysis.representation(model).predict(inputs, batch_size=500,
                                                             verbose=0))


def probes(model: keras.Model, limit: int | None) -> dict:
    """Few-shot accuracies (the paper's probe) and a linear probe on PROBE_TRAIN images,
    scored on PROBE_TEST held-out images (a smoke run's `limit` of each)."""
    train_images, train_labels = data.load_fashion_mnist("train")
    test_images, test_labels = data.load_fashion_mnist("test")
    count = min(limit or PROBE_TRAIN, PROBE_TRAIN)
    held_out = min(limit or PROBE_TEST, PROBE_TEST)
    features_train = representation_features(model, train_images[:count])
    features_test = representation_features(model, test_images[:held_out])
    few = analysis.few_shot(features_train, train_labels[:count], features_test,
                            test_labels[:held_out], shots=SHOTS)
    linear = analysis.linear_fewshot_accuracy(features_train, train_labels[:count],
                                              features_test, test_labels[:held_out], 10,
                                              l2=1.0)
    return {"few_shot": {str(k): round(v, 4) for k, v in few.items()},
            "linear_probe": round(linear, 4), "probe_train_images": count,
            "probe_test_images": held_out}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrain-epochs", type=int, default=3)
    parser.add_argument("--finetune-epochs", type=int, default=3)
    parser.add_argument("--out", default=os.path.join("runs", "mpp"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--recipe-option", action="append", default=[])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    limit = limit_flags(args.limit)
    supervised = [flag for option in args.recipe_option for flag in ("--recipe-option", option)]
    total = args.pretrain_epochs + args.finetune_epochs
    keras.utils.set_random_seed(0)
    pretrained = pretrain.main(["--epochs", str(args.pretrain_epochs), "--run-dir",
                                os.path.join(args.out, "pretrain"), *limit])
    tuned = finetune.main([pretrained["backbone"], "--recipe", "fashion_mnist", "--epochs",
                           str(args.finetune_epochs), "--run-dir",
                           os.path.join(args.out, "finetune"), *limit, *supervised])
    keras.utils.set_random_seed(0)
    scratch = train.main(["--epochs", str(total), "--run-dir",
                          os.path.join(args.out, "scratch"), *limit, *supervised])
    backbone = keras.saving.load_model(pretrained["backbone"])
    keras.utils.set_random_seed(0)
    random_backbone = keras.models.clone_model(backbone)  # same layers, fresh initial weights
    report = {
        "machine": describe_host(), "backend": keras.backend.backend(),
        "recipe_options": args.recipe_option,
        "pretrain": pretrained, "pretrain_then_finetune": tuned, "scratch": scratch,
        "probes": {"masked_patch_pretrained": probes(backbone, args.limit),
                   "random_init": probes(random_backbone, args.limit)},
    }
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
