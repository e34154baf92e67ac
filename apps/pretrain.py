"""Self-supervised pre-training by masked patch prediction (the paper's Section 4.6): half the
patches corrupted, their mean colour predicted; the training images' labels are not used.
The backbone is saved as backbone.keras in the run folder, for apps.finetune.

vit-keras pretrain [--objective masked-patch] [--target mean_color|downsized|pixels]
                   [--corruption 0.5] [--color-channels 1|3] [--seed 0]
                   [any vit-keras train flag: data, model, --epochs, --learning-rate, ...]
Without --variant the backbone is the reference run's model as a plain ViT (no ResNet:
patches of pixels, 7x7 of 28-pixel images) on Fashion-MNIST (grayscale: the targets are 3-bit
mean intensities, 8 classes).
"""

import dataclasses
import functools
import json
import os
import time

from . import train
from .common import (
    MASKED_TARGETS,
    NO_RESNET,
    RESULT_FILE,
    counted,
    fit_progress,
    model_config,
    run,
)

OBJECTIVES = ("masked-patch",)


def build_parser():
    parser = train.build_parser("pretrain", __doc__, classifier=False)
    group = parser.add_argument_group("masked patch prediction")
    group.add_argument("--objective", default="masked-patch", choices=OBJECTIVES,
                       help="the self-supervised objective (the paper's)")
    group.add_argument("--target", default="mean_color", choices=MASKED_TARGETS,
                       help="what each corrupted patch predicts (default: its mean colour)")
    group.add_argument("--corruption", type=float, default=0.5,
                       help="share of the patches corrupted (the paper: 0.5; also 0.15)")
    group.add_argument("--color-channels", type=int, default=None, choices=[1, 3],
                       help="3: colour targets (512 classes); 1: grayscale intensity (8); "
                            "default 1 for Fashion-MNIST, else 3")
    return parser


def fill_pretrain_defaults(args) -> None:
    main_job = args.variant is None and args.dataset == "fashion_mnist" and not args.folder
    if args.recipe is None and not main_job:
        args.recipe = "mpp"
    if args.color_channels is None:
        args.color_channels = 1 if main_job else 3
    if args.epochs is None:  # the main job's epoch count is for supervised training
        args.epochs = train.DEFAULT_EPOCHS
    if args.variant is None and args.resnet_layers is None:
        args.resnet_layers = NO_RESNET  # patches of pixels: train.fill_defaults' plain ViT
    train.fill_defaults(args)


def main(argv=None):
    args = build_parser().parse_args(argv)
    import keras

    from vit_keras import distribute, masked, training

    fill_pretrain_defaults(args)
    started = time.time()
    keras.utils.set_random_seed(args.seed)  # --seed (apps.train's) also seeds the corruption
    recipe = train.recipe_from_arguments(args)
    if not any(option.startswith("patch_drop_rate=") for option in args.recipe_option):
        recipe = dataclasses.replace(recipe, patch_drop_rate=0.0)  # every patch is predicted
    run_dir = args.run_dir or os.path.join(
        "runs", "pretrain_" + os.path.basename(args.folder or args.dataset))
    images, _, names = train.load_sources(args)
    steps = train.steps_per_epoch(images, args.batch_size)
    train.claim_run_dir(args, run_dir)
    keras.config.set_dtype_policy(args.precision)
    distribution = distribute.choose(args.distribution, args.tpu, args.model_axis)
    num_classes = len(names) or args.num_classes
    backbone = train.build_model(args, recipe, num_classes, distribution)
    with distribution.scope():
        model = masked.masked_patch_model(backbone, args.target, args.color_channels)
    batches, _ = train.pipelines(args, recipe, images, None, num_classes, backbone)
    batches = masked.masked_patch_pipeline(batches, model_config(args).patch_size, args.target,
                                           args.corruption, args.color_channels, args.seed)
    print(f"pre-training {backbone.name} by masked patch prediction ({args.target}, "
          f"{args.corruption:.0%} corrupted) with recipe {args.recipe} for "
          f"{counted(args.epochs, 'epoch')} of {counted(steps, 'step')}; "
          f"run dir {run_dir}")
    fit_started = time.time()
    history = training.train(
        model, recipe, batches, epochs=args.epochs, steps_per_epoch=steps, run_dir=run_dir,
        learning_rate=args.learning_rate, distribution=distribution,
        jit_compile=train.JIT_COMPILE[args.jit_compile],
        steps_per_execution=args.steps_per_execution, keep_checkpoints=args.keep_checkpoints,
        verbose=fit_progress(),
        compile=functools.partial(masked.compile_masked_patch_model, target=args.target))
    fit_seconds = time.time() - fit_started  # model.fit's alone: the save is save_seconds
    path = os.path.join(run_dir, "backbone.keras")
    save_started = time.time()
    backbone.save(path)
    save_seconds = time.time() - save_started
    last = history[max(history)]
    result = {"objective": args.objective, "target": args.target,
              "corruption": args.corruption, "color_channels": args.color_channels,
              "epochs": len(history), "loss": round(last["loss"], 4),
              "accuracy": round(last["accuracy"], 4) if "accuracy" in last else None,
              "fit_seconds": round(fit_seconds, 1), "save_seconds": round(save_seconds, 1),
              "total_seconds": round(time.time() - started, 1), "backbone": path}
    with open(os.path.join(run_dir, RESULT_FILE), "w") as file:
        json.dump(result, file, indent=1)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    run(main)
