"""The paper's masked patch prediction experiment (Section 4.6) at Fashion-MNIST scale, with
the experiments' model (benchmarks.ablation.EXPERIMENT_SHAPE): pre-train on the training
images without their labels, then fine-tune, against training from scratch for as many epochs
in all; and the linear probes of the pre-trained representation against a randomly
initialised one.

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

from apps import finetune, pretrain, train
from benchmarks import limit_flags, write_json
from benchmarks.ablation import EXPERIMENT_FLAGS
from benchmarks.machine import describe_host
from benchmarks.probes import probes


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
                                os.path.join(args.out, "pretrain"), *EXPERIMENT_FLAGS, *limit])
    tuned = finetune.main([pretrained["backbone"], "--recipe", "fashion_mnist", "--epochs",
                           str(args.finetune_epochs), "--run-dir",
                           os.path.join(args.out, "finetune"), *EXPERIMENT_FLAGS, *limit,
                           *supervised])
    keras.utils.set_random_seed(0)
    scratch = train.main(["--epochs", str(total), "--run-dir",
                          os.path.join(args.out, "scratch"), *EXPERIMENT_FLAGS, *limit,
                          *supervised])
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
