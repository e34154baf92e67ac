"""Trains a ViT with one of the recipes and evaluates it; with no arguments, the reference
run: a small ViT on Fashion-MNIST (offline), evaluated on its test split.

vit-keras train [--dataset fashion_mnist | --dataset NAME (tfds) | --folder DIR]
                [--recipe fashion_mnist|pretrain|finetune|scratch] [--epochs N] ...

A run folder (--run-dir) holds one run: the same command after an interruption resumes it
from the last finished epoch; a finished run, or other arguments, are refused unless
--overwrite clears the folder's run files first.
"""

import argparse
import dataclasses
import json
import math
import os
import shutil
import time

from .common import (
    CLASSIFIERS,
    DISTRIBUTIONS,
    LABELS_FILE,
    LORA_TARGETS,
    NO_RESNET,
    RECIPES,
    RESULT_FILE,
    SHAPE_FLAGS,
    add_data_arguments,
    add_model_arguments,
    app_parser,
    counted,
    fit_progress,
    model_from_arguments,
    non_negative_int,
    positive_int,
    run,
)

# The main job's model: a hybrid (the paper's Sec. 3.1) of Fashion-MNIST resized to 32 pixels:
# a ResNet stem of width 32 and one bottleneck unit make an 8x8 feature map, cut into 2x2
# patches (16 tokens), then 4 blocks of width 64, global average pooling and fixed sincos2d
# position embeddings (big_vision's "plain ViT" choices); notes/mainjob.md says why.
MAIN_JOB_MODEL = dict(variant="Ti/16", hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128,
                      patch_size=2, resnet_layers=(1,), resnet_width=32, image_size=32,
                      num_classes=10, classifier="gap", posemb="sincos2d")
# The main job's model as a plain ViT, with --resnet-layers none and for masked patch
# prediction (apps.pretrain), which corrupts patches of pixels: 7x7-pixel patches of 28-pixel
# images, the main job's model before the hybrid.
PLAIN_MAIN_JOB_MODEL = dict(resnet_layers=NO_RESNET, patch_size=7, image_size=28)
# --convnet's model where the flags do not shape it: the ResNet of the hybrids as a classifier
# of the main job's images, a teacher for its ViT (benchmarks/distillation.py).
CONVNET_MODEL = dict(resnet_layers=(2, 2, 2), resnet_width=32, image_size=32)
# The flags that shape or start a ViT, which a ResNet has no use for.
VIT_ONLY_FLAGS = ("variant", *SHAPE_FLAGS, "classifier", "posemb", "representation_size",
                  "exact_gelu", "attention_kernel", "family", "weights", "lora_rank", "remat",
                  "distillation_token")
# Its epochs, chosen in notes/mainjob.md; other runs default to DEFAULT_EPOCHS.
MAIN_JOB_EPOCHS, DEFAULT_EPOCHS = 8, 20
# The main job compiles with XLA on TensorFlow, whose CPU kernels run its small model slower
# (docs/performance.md, the main-model rows); the other backends keep Keras' choice.
MAIN_JOB_JIT_COMPILE = {"tensorflow": "true"}
JIT_COMPILE = {"auto": "auto", "true": True, "false": False}
# The flags that choose a run's data, kept in result.json's "data" for the apps that read the
# run later (export): a folder's, or a dataset's.
FOLDER_FLAGS = ("folder", "eval_folder", "validation_split")
DATASET_FLAGS = ("dataset", "data_dir", "train_split", "eval_split", "validation_split")
# What a run writes into its folder (vit_keras.training.callbacks, write_results, apps.pretrain),
# the arguments it was started with first.
ARGUMENTS_FILE = "arguments.json"
RUN_FILES = (ARGUMENTS_FILE, "history.json", "history.csv", "backup", "last.keras",
             "checkpoints", "logs", "model.keras", "backbone.keras", LABELS_FILE, RESULT_FILE)
# Flags that leave what a run computes unchanged.
NOT_RUN_ARGUMENTS = ("debug", "verbose", "overwrite", "run_dir", "keep_checkpoints")


# What a classifier's training adds to the flags (build_parser's classifier=True): a teacher,
# and a convnet in place of the ViT; another objective (apps.pretrain) leaves them out.
CLASSIFIER_DEFAULTS = dict(teacher=None, distillation=None, distillation_token=False,
                           convnet=False)


def build_parser(name: str = "train", doc: str = __doc__, classifier: bool = True,
                 convnet: bool = True) -> argparse.ArgumentParser:
    """The training flags; classifier=False leaves out those of a classifier's training only
    (CLASSIFIER_DEFAULTS); convnet=False hides --convnet from --help, for an app that refuses
    it with its own message."""
    parser = app_parser(name, doc)
    source = add_data_arguments(parser, "training and held-out images")
    source.add_argument("--eval-folder", help="held-out DIR/<class>/<images> for --folder")
    source.add_argument("--train-split", default="train", help="tfds split to train on")
    source.add_argument("--eval-split", default="test", help="tfds split to evaluate on")
    source.add_argument("--validation-split", type=positive_int, default=None, metavar="N",
                        help="hold out the last N training images and evaluate on them instead "
                             "of the held-out split (which is then not read): for choosing a "
                             "recipe")
    source.add_argument("--on-bad-image", default="skip", choices=["skip", "raise"],
                        help="an unreadable file in --folder: leave it out with a warning, or "
                             "stop")
    fit = parser.add_argument_group("training")
    fit.add_argument("--recipe", default=None, choices=RECIPES,
                     help="default: fashion_mnist for the reference run, else scratch")
    fit.add_argument("--epochs", type=positive_int, default=None,
                     help=f"passes over the data (default {MAIN_JOB_EPOCHS} for the reference run, "
                          f"else {DEFAULT_EPOCHS})")
    fit.add_argument("--batch-size", type=positive_int, default=128,
                     help="global batch, split over the replicas")
    fit.add_argument("--learning-rate", type=float, default=None, help="the schedule's peak")
    fit.add_argument("--weights", help="initial weights: a file (.npz, .keras, ...) or a "
                                       "pre-trained name such as augreg_in21k")
    fit.add_argument("--lora-rank", type=positive_int, default=None,
                     help="train only rank-N LoRA adapters (and the head) instead of every "
                          "weight; the saved model.keras holds the adapters merged")
    fit.add_argument("--lora-targets", nargs="+", default=["query", "value"],
                     choices=LORA_TARGETS, help="the block layers that get adapters")
    fit.add_argument("--remat", action="store_true",
                     help="recompute each block in the backward pass to save memory")
    fit.add_argument("--grad-accum", type=positive_int, default=None,
                     help="average gradients over N steps before each update")
    fit.add_argument("--ema", type=float, default=None,
                     help="Polyak averaging of the weights with this momentum (e.g. 0.9999)")
    fit.add_argument("--limit", type=positive_int, default=None,
                     help="use only N training images")
    fit.add_argument("--eval-limit", type=positive_int, default=None,
                     help="evaluate on the first N held-out images only")
    fit.add_argument("--run-dir", default=None,
                     help="the run's folder, one run a folder (default: runs/<dataset>)")
    fit.add_argument("--keep-checkpoints", type=positive_int, default=1, metavar="K",
                     help="keep the models of the last K epochs (run folder's "
                          "checkpoints/epoch-NNN.keras) as well as last.keras, the latest")
    fit.add_argument("--overwrite", action="store_true",
                     help="clear the run folder's files and start anew, where it holds a "
                          "finished run or one with other arguments")
    fit.add_argument("--distribution", default="auto", choices=DISTRIBUTIONS,
                     help="auto picks from the devices present (see docs/distribute.md)")
    fit.add_argument("--tpu", help="TPU name or grpc:// address for --distribution tpu")
    fit.add_argument("--model-axis", type=positive_int, default=2,
                     help="devices per model replica for --distribution model-parallel")
    fit.add_argument("--steps-per-execution", type=positive_int, default=1,
                     help="train steps per compiled call (TPU: 32 or more)")
    fit.add_argument("--jit-compile", default=None, choices=sorted(JIT_COMPILE),
                     help="model.compile's jit_compile (XLA on TensorFlow and JAX, "
                          "torch.compile on PyTorch); default Keras' auto, and true for the "
                          "reference run on TensorFlow")
    fit.add_argument("--precision", default="float32", choices=["float32", "mixed_bfloat16"],
                     help="Keras dtype policy")
    fit.add_argument("--eval-every", type=non_negative_int, default=None, metavar="N",
                     help="evaluate on the held-out split every N epochs as well as at the end "
                          "(0: only at the end); default 1, and 0 for the reference run")
    fit.add_argument("--seed", type=int, default=0,
                     help="seeds the initial weights, the shuffling and the augmentation")
    fit.add_argument("--recipe-option", action="append", default=[], metavar="FIELD=VALUE",
                     help="change one field of the recipe (vit_keras.training.Recipe), e.g. "
                          "label_smoothing=0.1; repeat for more")
    model = add_model_arguments(
        parser, "the reference run's model (a hybrid: 32-pixel images through a ResNet stem of "
                "width 32 and one bottleneck unit, 2x2 patches of its feature map, 4 blocks of "
                "width 64, global average pooling, sincos2d); with --variant, --image-size is "
                "224 unless given", image_size=None)
    if classifier:
        add_classifier_arguments(parser, model, convnet)
    parser.set_defaults(**CLASSIFIER_DEFAULTS)  # the flags' defaults, and without them
    return parser


def add_classifier_arguments(parser: argparse.ArgumentParser, model, convnet: bool) -> None:
    """A teacher's flags (docs/distillation.md), and --convnet among the model's (listed in
    --help where `convnet`)."""
    teach = parser.add_argument_group(
        "training with a teacher (docs/distillation.md)",
        "DeiT's distillation: the teacher's logits as a second target, its own head with "
        "--distillation-token; tau and lambda with --recipe-option distillation_temperature=T "
        "and distillation_weight=L")
    teach.add_argument("--teacher", metavar="TEACHER.keras",
                       help="the teacher: any Keras classifier of the same classes saved as "
                            ".keras (a run's model.keras), frozen while the student trains")
    teach.add_argument("--distillation", choices=["hard", "soft"],
                       help="the teacher's term: its top-1 as a label (hard), or its "
                            "distribution at temperature tau (soft)")
    teach.add_argument("--distillation-token", action="store_true",
                       help="give the student DeiT's distillation token (needs --classifier "
                            "token): the teacher's term trains its head, the labels the class "
                            "token's; the saved model answers with their mean")
    model.add_argument("--convnet", action="store_true", help=(
        "train the paper's ResNet (the hybrids' stem, BiT-style) with global average pooling and "
        "a head instead of a ViT, shaped by --resnet-layers, --resnet-width, --image-size and "
        f"--num-classes (default {','.join(map(str, CONVNET_MODEL['resnet_layers']))}, "
        f"{CONVNET_MODEL['resnet_width']}, {CONVNET_MODEL['image_size']} px): a teacher for "
        "distillation, or a convnet baseline") if convnet else argparse.SUPPRESS)


def fill_defaults(args) -> None:
    """Without --variant the model is the main job's; flags given still win."""
    import keras

    main_job = args.variant is None
    if args.convnet:
        convnet_defaults(args)
    elif main_job:
        plain = args.resnet_layers == NO_RESNET  # then the plain ViT's patches and image size
        for key, value in {**MAIN_JOB_MODEL, **(PLAIN_MAIN_JOB_MODEL if plain else {})}.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    elif args.image_size is None:
        args.image_size = 224
    if args.jit_compile is None:
        backend = keras.backend.backend()
        args.jit_compile = MAIN_JOB_JIT_COMPILE.get(backend, "auto") if main_job else "auto"
    if args.eval_every is None:  # the main job's time goes to training; result.json scores it
        args.eval_every = 0 if main_job else 1
    if args.recipe is None:
        plain_main_job = args.dataset == "fashion_mnist" and not args.folder
        args.recipe = "fashion_mnist" if plain_main_job else "scratch"
    if args.epochs is None:
        args.epochs = MAIN_JOB_EPOCHS if main_job and args.recipe == "fashion_mnist" else (
            DEFAULT_EPOCHS)


def convnet_defaults(args) -> None:
    """--convnet's model: the ViT's flags refused, CONVNET_MODEL where the flags say nothing."""
    defaults = build_parser()
    given = [key for key in VIT_ONLY_FLAGS if getattr(args, key) != defaults.get_default(key)]
    if given:
        raise ValueError(f"--convnet trains a ResNet, which has no use for "
                         f"{', '.join('--' + key.replace('_', '-') for key in given)}: leave "
                         f"{'it' if len(given) == 1 else 'them'} out")
    if args.resnet_layers == NO_RESNET:
        raise ValueError("--convnet trains a ResNet, not --resnet-layers none: give its units "
                         "per stage (e.g. 2,2,2), or 'stem' for the root alone")
    for key, value in CONVNET_MODEL.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def run_dir_of(args) -> str:
    """--run-dir, or runs/ and the data's name."""
    return args.run_dir or os.path.join("runs", os.path.basename(args.folder or args.dataset))


def run_arguments(args) -> dict:
    """The parsed arguments that decide what a run computes, as arguments.json keeps them."""
    return json.loads(json.dumps({key: value for key, value in sorted(vars(args).items())
                                  if key not in NOT_RUN_ARGUMENTS}))


def argument_changes(run_dir: str, arguments: dict) -> list[str]:
    """Each argument that differs from the run's arguments.json, as "--flag old, now new"."""
    with open(os.path.join(run_dir, ARGUMENTS_FILE)) as file:
        recorded = json.load(file)
    return [f"--{key.replace('_', '-')} {recorded.get(key)!r}, now {arguments.get(key)!r}"
            for key in sorted(recorded.keys() | arguments.keys())
            if recorded.get(key) != arguments.get(key)]


def finished_result(argv: list[str]) -> dict | None:
    """The result.json of the run that argv describes (its --run-dir), where that run finished
    with these arguments; None where it has not finished. A finished run with other arguments
    raises FileExistsError, so that a caller never takes one run's result for another's."""
    args = build_parser().parse_args(argv)
    fill_defaults(args)
    run_dir = run_dir_of(args)
    if not os.path.exists(os.path.join(run_dir, RESULT_FILE)):
        return None
    differ = argument_changes(run_dir, run_arguments(args))
    if differ:
        raise FileExistsError(f"run folder {run_dir!r} holds a finished run with other "
                              f"arguments ({'; '.join(differ)})")
    with open(os.path.join(run_dir, RESULT_FILE)) as file:
        return json.load(file)


def claim_run_dir(args, run_dir: str) -> None:
    """Makes run_dir this run's folder: a new one, or this run's unfinished one to resume. A
    finished run, a run with other arguments and run files of unknown arguments are refused;
    --overwrite removes the run files first (nothing else in the folder). A folder whose run
    never got past its arguments (a mistake in them, a crash before training) starts anew."""
    arguments = run_arguments(args)
    present = [name for name in RUN_FILES if os.path.lexists(os.path.join(run_dir, name))]
    again = "; pass --overwrite to start it anew, or another --run-dir"
    if args.overwrite or present in ([], [ARGUMENTS_FILE]):
        for name in present:
            path = os.path.join(run_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    elif RESULT_FILE in present:
        raise FileExistsError(f"run folder {run_dir!r} holds a finished run (result.json)"
                              + again)
    elif ARGUMENTS_FILE not in present:
        raise FileExistsError(f"run folder {run_dir!r} holds run files ({', '.join(present)}) "
                              f"without {ARGUMENTS_FILE}, so no run can resume it" + again)
    else:
        differ = argument_changes(run_dir, arguments)
        if differ:
            raise FileExistsError(f"run folder {run_dir!r} holds a run with other arguments "
                                  f"({'; '.join(differ)})" + again)
        return  # the same run, resumed
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, ARGUMENTS_FILE), "w") as file:
        json.dump(arguments, file, indent=1)


def recipe_from_arguments(args):
    """The vit_keras.training.Recipe of --recipe, with the options given."""
    from vit_keras import training

    recipe = training.with_options(training.RECIPES[args.recipe], args.recipe_option)
    if args.grad_accum or args.ema:
        recipe = dataclasses.replace(
            recipe, ema_momentum=args.ema or recipe.ema_momentum,
            gradient_accumulation_steps=args.grad_accum or recipe.gradient_accumulation_steps)
    return with_teacher_flags(args, recipe)


def with_teacher_flags(args, recipe):
    """The recipe with --teacher, --distillation and --distillation-token, checked before
    the run starts."""
    teacher = args.teacher or recipe.teacher
    kind = args.distillation or recipe.distillation
    if teacher and not kind:
        raise ValueError("--teacher needs --distillation hard or soft")
    if kind and not teacher:
        raise ValueError(f"--distillation {kind} needs --teacher TEACHER.keras")
    if kind and not os.path.isfile(teacher):
        raise ValueError(f"--teacher {teacher!r}: expected a .keras file, found none")
    recipe = dataclasses.replace(
        recipe, teacher=teacher, distillation=kind,
        distillation_token=args.distillation_token or recipe.distillation_token)
    classifier = args.classifier or CLASSIFIERS[0]
    if recipe.distillation_token and classifier != "token":
        raise ValueError(f"--distillation-token needs --classifier token (the distillation "
                         f"token sits beside the class token), got --classifier {classifier}")
    return recipe


def count_examples(dataset) -> int:
    known = int(dataset.cardinality())
    return known if known >= 0 else sum(1 for _ in dataset)


def steps_per_epoch(train, batch_size: int) -> int:
    """Whole batches of the training images: the pipeline drops a partial last batch, so
    fewer images than one batch are refused."""
    count = count_examples(train)
    if count < batch_size:
        raise ValueError(f"fewer training images ({count}) than one batch ({batch_size}): "
                         "pass a smaller --batch-size")
    return count // batch_size


def load_sources(args):
    """(train dataset, eval dataset or None, class names)."""
    from vit_keras import data

    train, names = data.load_source(args.dataset, args.train_split, args.folder, args.data_dir,
                                    args.on_bad_image)
    if args.validation_split:
        train, evaluation = data.split_last(train, args.validation_split)
    elif args.folder:
        evaluation = (data.from_folder(args.eval_folder, on_error=args.on_bad_image)[0]
                      if args.eval_folder else None)
    else:
        evaluation, _ = data.load_source(args.dataset, args.eval_split, None, args.data_dir)
    if args.limit:
        train = train.take(args.limit)
    if args.eval_limit and evaluation is not None:
        evaluation = evaluation.take(args.eval_limit)
    return train, evaluation, names


def pipelines(args, recipe, train, evaluation, num_classes, model):
    """(repeated training batches, held-out batches or None), normalised by the model's input
    convention (its weights' release's, else [-1, 1])."""
    from vit_keras import data, training
    from vit_keras.preprocessing import feeding

    common = dict(image_size=args.image_size, num_classes=num_classes,
                  batch_size=args.batch_size, channels=3, convention=feeding(model))
    # Fashion-MNIST is read into memory whole (data.load_fashion_mnist): its resized copy fits
    # beside it, and the epochs after the first skip the resize.
    in_memory = args.dataset == "fashion_mnist" and not args.folder
    train_batches = data.make_pipeline(train, training=True, **training.pipeline_options(recipe),
                                       seed=args.seed, cache=in_memory, **common).repeat()
    eval_batches = (data.make_pipeline(evaluation, training=False, cache=True, **common)
                    if evaluation is not None else None)
    return train_batches, eval_batches


def build_model(args, recipe, num_classes, distribution):
    """The model of the flags in the distribution's scope, with its initial weights."""
    import vit_keras as vk
    from vit_keras.weights import load_weights

    with distribution.scope():
        if args.convnet:
            return vk.resnet.classifier(args.image_size, num_classes, args.resnet_layers,
                                        args.resnet_width)
        model = model_from_arguments(args, num_classes=num_classes,
                                     dropout_rate=recipe.dropout_rate,
                                     stochastic_depth_rate=recipe.stochastic_depth_rate,
                                     patch_drop_rate=recipe.patch_drop_rate,
                                     distilled=recipe.distillation_token,
                                     remat=args.remat)
        if args.weights:
            report = load_weights(model, args.weights, variant=args.variant)
            print(report if report is not None else f"{args.weights}: loaded")
        if args.lora_rank:
            vk.lora(model, rank=args.lora_rank, targets=args.lora_targets)
    return model


def held_out_scores(model, eval_batches, split: str, test_time_flip: bool) -> dict:
    """Top-1 and top-5 accuracy on the held-out batches, of the recipe's evaluation; with
    test-time flips, the single view's top-1 beside."""
    from vit_keras import evaluation

    started = time.time()
    logits, mirrored, labels = evaluation.predict_views(model, eval_batches, test_time_flip)
    names = [str(i) for i in range(logits.shape[-1])]
    report = evaluation.classification_report(evaluation.with_mirrors(logits, mirrored), labels,
                                              names)
    scores = {f"{split}_accuracy": round(report["top1"], 4),
              f"{split}_top5": round(report["top5"], 4)}
    if mirrored is not None:
        single_view = evaluation.classification_report(logits, labels, names)
        scores[f"{split}_accuracy_single_view"] = round(single_view["top1"], 4)
    return {**scores, "evaluate_seconds": round(time.time() - started, 1)}


def write_results(args, run_dir, model, names, num_classes, history, eval_batches, started,
                  fit_seconds, test_time_flip: bool) -> dict:
    import keras

    import vit_keras as vk

    model_path = os.path.join(run_dir, "model.keras")
    save_started = time.time()
    (vk.merge_lora(model) if args.lora_rank else model).save(model_path)
    result = {"epochs": len(history), "backend": keras.backend.backend(),
              "fit_seconds": round(fit_seconds, 1),
              "save_seconds": round(time.time() - save_started, 1),
              "model": model_path, "trainable_parameters": sum(
                  int(math.prod(weight.shape)) for weight in model.trainable_weights)}
    if eval_batches is not None:
        split = "validation" if args.validation_split else "test"
        result.update(held_out_scores(model, eval_batches, split, test_time_flip))
    with open(os.path.join(run_dir, LABELS_FILE), "w") as file:
        file.write("\n".join(names or map(str, range(num_classes))) + "\n")
    result["total_seconds"] = round(time.time() - started, 1)
    result["data"] = {key: getattr(args, key)
                      for key in (FOLDER_FLAGS if args.folder else DATASET_FLAGS)}
    with open(os.path.join(run_dir, RESULT_FILE), "w") as file:
        json.dump(result, file, indent=1)
    print(json.dumps(result, indent=1))
    print(f"model: {model_path}; history: {os.path.join(run_dir, 'history.csv')}; "
          f"labels: {os.path.join(run_dir, LABELS_FILE)}")
    return result


def main(argv=None):
    return run_training(build_parser().parse_args(argv))


def run_training(args) -> dict:
    """Trains, evaluates and writes the run described by parsed arguments."""
    import keras

    from vit_keras import distribute, training

    fill_defaults(args)
    started = time.time()
    keras.utils.set_random_seed(args.seed)
    recipe = recipe_from_arguments(args)
    run_dir = run_dir_of(args)
    train, evaluation, names = load_sources(args)
    steps = steps_per_epoch(train, args.batch_size)
    claim_run_dir(args, run_dir)  # once the data is found: a mistake there leaves no folder
    num_classes = len(names) or args.num_classes
    keras.config.set_dtype_policy(args.precision)
    distribution = distribute.choose(args.distribution, args.tpu, args.model_axis)
    model = build_model(args, recipe, num_classes, distribution)
    train_batches, eval_batches = pipelines(args, recipe, train, evaluation, num_classes, model)
    if eval_batches is None:
        print("no held-out images: the run is not evaluated (pass --eval-folder or "
              "--validation-split N)")
    replicas = counted(distribution.num_replicas, "replica")
    print(f"training {model.name} ({model.count_params():,} parameters) with recipe "
          f"{args.recipe} for {counted(args.epochs, 'epoch')} of {counted(steps, 'step')} "
          f"(global batch {args.batch_size} over {replicas}, distribution "
          f"{distribution.kind}, jit_compile {args.jit_compile}); run dir {run_dir}")
    fit_started = time.time()
    history = training.train(model, recipe, train_batches, epochs=args.epochs,
                             steps_per_epoch=steps, run_dir=run_dir,
                             validation_data=eval_batches if args.eval_every else None,
                             validation_freq=args.eval_every or 1,
                             learning_rate=args.learning_rate,
                             distribution=distribution,
                             jit_compile=JIT_COMPILE[args.jit_compile],
                             steps_per_execution=args.steps_per_execution,
                             keep_checkpoints=args.keep_checkpoints,
                             verbose=fit_progress())
    return write_results(args, run_dir, model, names, num_classes, history, eval_batches,
                         started, time.time() - fit_started, recipe.test_time_flip)


if __name__ == "__main__":
    run(main)
