"""The token budget's trade-off (issue 66): token merging (ToMe, vk.merge_tokens) and pruning
(EViT, vk.prune_tokens) measured as accuracy, throughput, latency, memory and FLOPs together.

Accuracy: the Fashion-MNIST model with 4x4-pixel patches (docs/models/fashion_mnist_p4.keras)
gains a class token (EViT ranks the patches by its attention; it starts at zero) and is
fine-tuned at 56 px (196 patches) as benchmarks.resolution does at 40 px, without patch
dropout. Merging is applied off the shelf to that fine-tuned model; pruning is fine-tuned with
the same recipe, epochs and seed from the same start, one run per keep rate, and is also
applied off the shelf to the fine-tuned model. Every row is scored on a validation split
carved from the training images, and once on the test split; single views (no test-time
flips), as the speed is measured.

Speed: for the fine-tuned Fashion-MNIST rows, and Ti/16 and B/16 at 224 px with random weights
(a budget's shapes, not its weights, set its cost): Keras images/s at --batch and latency at
batch 1, and the batch-1 latency of the float32 and full-integer int8 TFLite files
(vit_keras.export) in LiteRT, each model timed in turns with the unreduced one; peak memory of
the first inference call (benchmarks.memory) for the 224 px models, each in a process of its
own; FLOPs counted from the shapes; the tokens each block outputs. Speed-ups are ratios to the
unreduced model of the same run.

python -m benchmarks.token_budget [--parts accuracy speed] [--r 16 32 48 64]
    [--keep-rates 0.7 0.5 0.3] [--variants Ti/16 B/16] [--variant-r 4 8 12 16]
    [--variant-batch 32 8] [--litert-variants Ti/16] [--epochs 1] [--validation-split 10000]
    [--out runs/token_budget] [--json-dir docs/tokens] [--limit N] [--smoke]

Runs under the current KERAS_BACKEND (the LiteRT rows need TensorFlow, which exports). The speed
part reads the fine-tuned models the accuracy part left in --out. With --json-dir it writes
accuracy.json, speed.json and the plot of accuracy against throughput (tradeoff.png, where
matplotlib is installed).
"""

import argparse
import json
import os
import shutil
import time

import keras
import numpy as np

import vit_keras as vk
from apps import finetune, train
from apps.common import fit_progress, model_config, model_from_arguments
from benchmarks import SMOKE_IMAGE_SIZE, limit_flags, write_json
from benchmarks.machine import describe_host
from benchmarks.memory import peak_memory_of, run_child
from benchmarks.runners import block_macs, keras_runner, model_spec
from benchmarks.timing import measure_in_turns, timed_in_turns
from vit_keras.tokens.budget import token_counts

# fashion_mnist_p4.keras's patch size; the fine-tuning size: a 14x14 grid of patches
PATCH_SIZE, IMAGE_SIZE, FASHION_MNIST_CLASSES = 4, 56, 10
ACCURACY_FILE, SPEED_FILE, PLOT_FILE = "accuracy.json", "speed.json", "tradeoff.png"
# The TFLite files each speed row is timed in (vit_keras.export.FORMATS).
LITERT_FORMATS = ("tflite_float32", "tflite_int8")
# The images an int8 file's top-1 agreement with the Keras model is counted on.
AGREEMENT_IMAGES = 256
# The methods by name: how each makes a model of a trained one, and the word for its amount.
METHODS = {"ToMe": (vk.merge_tokens, "r={}"), "EViT": (vk.prune_tokens, "keep {}")}
BASELINE = {"method": "none", "amount": None}


def row_label(row: dict) -> str:
    """"none", "ToMe r=16", "EViT keep 0.7"."""
    if row["method"] == "none":
        return "none"
    return f"{row['method']} {METHODS[row['method']][1].format(row['amount'])}"


def reduce(model: keras.Model, row: dict) -> keras.Model:
    """The model with the row's budget, sharing its weights (the model itself for none)."""
    if row["method"] == "none":
        return model
    return METHODS[row["method"]][0](model, row["amount"])


def budget_rows(r_values, keep_rates) -> list[dict]:
    """The unreduced row, then merging at each r, then pruning at each keep rate."""
    return [BASELINE, *({"method": "ToMe", "amount": r} for r in r_values),
            *({"method": "EViT", "amount": keep} for keep in keep_rates)]


def forward_flops(config: vk.ViTConfig, image_size: int, counts: list[int], merging: bool,
                  num_classes: int, prefix: int = 1, channels: int = 3) -> float:
    """2 x multiply-accumulates of one forward pass of a plain ViT whose blocks output `counts`
    tokens: each block's attention runs on the tokens it receives, its MLP on those it keeps
    (the reduction sits between them), and merging adds its key similarities (A x B x head
    width); the reductions' gathers and the proportional attention's bias are not counted."""
    patches = (image_size // config.patch_size) ** 2
    d, m = config.hidden_size, config.mlp_dim
    macs = patches * config.patch_size**2 * channels * d + d * num_classes
    for tokens, out in zip([patches + prefix, *counts[:-1]], counts, strict=True):
        macs += block_macs(tokens, out, d, m)
        if merging and out < tokens:
            macs += (tokens + 1) // 2 * (tokens // 2) * (d // config.num_heads)
    return 2.0 * macs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=["accuracy", "speed"],
                        default=["accuracy", "speed"])
    parser.add_argument("--model",
                        default=os.path.join("docs", "models", "fashion_mnist_p4.keras"))
    parser.add_argument("--image-size", type=int, default=IMAGE_SIZE)
    parser.add_argument("--r", type=int, nargs="+", default=[16, 32, 48, 64],
                        help="ToMe's r per block on the Fashion-MNIST model (4 blocks)")
    parser.add_argument("--keep-rates", type=float, nargs="+", default=[0.7, 0.5, 0.3],
                        help="EViT's keep rates (at blocks 1, 2, 3 of 4; 3, 6, 9 of 12)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--recipe", default="fashion_mnist")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--validation-split", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=32,
                        help="the Fashion-MNIST model's inference batch")
    parser.add_argument("--variants", nargs="*", default=["Ti/16", "B/16"])
    parser.add_argument("--variant-image-size", type=int, default=224)
    parser.add_argument("--variant-r", type=int, nargs="+", default=[4, 8, 12, 16],
                        help="ToMe's r per block on the variants (12 blocks)")
    parser.add_argument("--variant-batch", type=int, nargs="+", default=[32, 8],
                        help="inference batch per variant (one value: all)")
    parser.add_argument("--litert-variants", nargs="*", default=["Ti/16"],
                        help="the variants also exported to TFLite and timed in LiteRT")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--min-sample", type=float, default=0.5)
    parser.add_argument("--out", default=os.path.join("runs", "token_budget"))
    parser.add_argument("--json-dir", default=None)
    parser.add_argument("--limit", type=int, default=None,
                        help="train on N images, score N validation and N test images")
    parser.add_argument("--smoke", action="store_true",
                        help="28 px, 64 images, one r and keep rate, the tiny model for the "
                             "variants, one repetition: checks the benchmark runs")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    return parser


def smoke(args) -> None:
    """--smoke's settings, in place."""
    args.image_size, args.limit, args.r, args.keep_rates = 28, 64, [4], [0.5]
    args.variants, args.litert_variants, args.variant_r = ["smoke"], [], [2]
    args.variant_image_size, args.variant_batch, args.batch = SMOKE_IMAGE_SIZE, [2], 2
    args.repeats, args.warmup, args.min_sample = 1, 1, 0.01


# --- accuracy -------------------------------------------------------------------------------

def finetune_args(args, keep: float):
    """vit-keras finetune's arguments for the run at that keep rate (1.0: no pruning)."""
    flags = [args.model, "--resnet-layers", "none", "--image-size", str(args.image_size),
             "--patch-size", str(PATCH_SIZE), "--recipe", args.recipe,
             "--learning-rate", str(args.learning_rate), "--epochs", str(args.epochs),
             "--validation-split", str(args.validation_split),
             "--run-dir", os.path.join(args.out, f"keep{keep:g}"), *limit_flags(args.limit)]
    if args.smoke:
        flags += ["--batch-size", "32", "--jit-compile", "false"]
    parsed = finetune.build_parser().parse_args(flags)
    train.fill_defaults(parsed)
    parsed.num_classes = FASHION_MNIST_CLASSES
    return parsed


def starting_model(run):
    """The 4x4-patch model at the run's size with a class token added at zero (the checkpoint
    has none), every other weight the checkpoint's, the position embeddings fitted to the new
    grid by the loader; no patch dropout, whose token counts pruning would rank."""
    from vit_keras.weights.assign import load_params
    from vit_keras.weights.files import load_model
    from vit_keras.weights.npz import model_params

    recipe = train.recipe_from_arguments(run)
    model = model_from_arguments(run, class_token=True, num_classes=run.num_classes,
                                 dropout_rate=recipe.dropout_rate,
                                 stochastic_depth_rate=recipe.stochastic_depth_rate)
    params = model_params(load_model(run.weights_file, compile=False))
    params["cls"] = np.zeros((1, 1, run.hidden_size), "float32")
    print(load_params(model, params, run.weights_file, "Keras model (.keras) with a zero class "
                                                        "token;"))
    return model


def fine_tune(args, keep: float) -> tuple[keras.Model, dict]:
    """The model fine-tuned with pruning at that keep rate (none at 1.0), and its run's facts;
    the run's folder starts empty."""
    from vit_keras import training

    run = finetune_args(args, keep)
    shutil.rmtree(run.run_dir, ignore_errors=True)
    keras.utils.set_random_seed(run.seed)
    recipe = train.recipe_from_arguments(run)
    training_images, _, _ = train.load_sources(run)
    base = starting_model(run)
    model = reduce(base, {"method": "EViT", "amount": keep}) if keep < 1 else base
    batches, _ = train.pipelines(run, recipe, training_images, None, run.num_classes, model)
    started = time.time()
    training.train(
        model, recipe, batches, epochs=run.epochs,
        steps_per_epoch=train.steps_per_epoch(training_images, run.batch_size),
        run_dir=run.run_dir, learning_rate=run.learning_rate,
        jit_compile=train.JIT_COMPILE[run.jit_compile], verbose=fit_progress())
    return model, {"fit_seconds": round(time.time() - started, 1)}


def held_out(args) -> tuple[dict, dict]:
    """({"validation": batches, "test": batches} at the run's size, single views, and the
    images in each)."""
    run = finetune_args(args, 1.0)
    recipe = train.recipe_from_arguments(run)
    training_images, validation, _ = train.load_sources(run)
    run.validation_split = None
    _, test, _ = train.load_sources(run)
    model = vk.vit(model_config(run), image_size=run.image_size,  # its input convention
                   num_classes=run.num_classes)
    splits = {"validation": validation, "test": test}
    return ({split: train.pipelines(run, recipe, training_images, images, run.num_classes,
                                    model)[1] for split, images in splits.items()},
            {split: train.count_examples(images) for split, images in splits.items()})


def scores(model: keras.Model, batches: dict) -> dict:
    """Top-1 accuracy on each split."""
    return {f"{split}_accuracy": train.held_out_scores(model, data, split, False)
            [f"{split}_accuracy"] for split, data in batches.items()}


def accuracy_rows(args, batches: dict) -> list[dict]:
    """Every row's accuracy: the fine-tuned model, merging on it off the shelf, pruning
    fine-tuned at each keep rate and applied off the shelf."""
    baseline, facts = fine_tune(args, 1.0)
    rows = [{**BASELINE, "training": "fine-tuned", **facts}]
    rows += [{**row, "training": "off the shelf"} for row in budget_rows(args.r, [])[1:]]
    for keep in args.keep_rates:
        model, facts = fine_tune(args, keep)
        row = {"method": "EViT", "amount": keep}
        rows += [{**row, "training": "fine-tuned", **facts, "model": model},
                 {**row, "training": "off the shelf"}]
    for row in rows:
        model = row.pop("model", None) or reduce(baseline, row)
        row.update(label=row_label(row), tokens_per_block=token_counts(model),
                   **scores(model, batches))
        print(f"{row['label']:>16} {row['training']:>13}: validation "
              f"{row['validation_accuracy']:.2%}, test {row['test_accuracy']:.2%}", flush=True)
    return rows


def run_accuracy(args) -> dict:
    run = finetune_args(args, 1.0)
    batches, counts = held_out(args)
    return {"machine": describe_host(), "backend": keras.backend.backend(),
            "model": args.model, "image_size": args.image_size, "recipe": args.recipe,
            "learning_rate": args.learning_rate, "epochs": args.epochs,
            "batch_size": run.batch_size, "validation_images": counts["validation"],
            "test_images": counts["test"], "limit": args.limit, "patch_drop_rate": 0.0,
            "rows": accuracy_rows(args, batches)}


# --- speed ----------------------------------------------------------------------------------

def fine_tuned_models(args) -> dict:
    """The speed rows' models by label, from the accuracy part's runs in --out: the fine-tuned
    model, merging on it, and each keep rate's fine-tuned model."""
    from vit_keras.weights.files import load_model

    def load(keep):
        return load_model(os.path.join(args.out, f"keep{keep:g}", "last.keras"), compile=False)

    baseline = load(1.0)
    models = {row_label(row): (row, reduce(baseline, row)) for row in budget_rows(args.r, [])}
    models.update({row_label(row): (row, load(row["amount"]))
                   for row in budget_rows([], args.keep_rates)[1:]})
    return models


def fashion_images(args, count: int) -> np.ndarray:
    """The first `count` validation images at the model's size as uint8, what the exports
    take."""
    images = np.concatenate([np.asarray(x) for x, _ in held_out(args)[0]["validation"].take(
        -(-count // finetune_args(args, 1.0).batch_size))])[:count]
    return np.round((images + 1.0) * 127.5).astype("uint8")


def variant_models(variant: str, image_size: int, r_values, keep_rates) -> dict:
    """The variant's rows' models by label, with random weights shared by all."""
    config, image_size = model_spec(variant, image_size)
    base = vk.vit(config, image_size=image_size, num_classes=1000)
    return {row_label(row): (row, reduce(base, row))
            for row in budget_rows(r_values, keep_rates)}


def litert_files(model: keras.Model, out: str, sample, representative) -> dict:
    """{format: its line of the export report (vit_keras.export.verify's, with its path), or the
    error LiteRT raised running it} for LITERT_FORMATS, exported from model into out; a file
    LiteRT fails to run is reported and the others are kept."""
    from vit_keras import export

    def write(folder, formats):
        report = export.export_all(model, folder, sample, representative, formats=formats,
                                   overwrite=True, tolerances=dict.fromkeys(formats, (None, 0.0)))
        return {name: {**line, "path": os.path.join(folder, export.FORMATS[name].file_name)}
                for name, line in report["formats"].items()}

    try:
        return write(out, LITERT_FORMATS)
    except RuntimeError:  # one file fails in LiteRT: export each alone to find which
        found = {}
        for name in LITERT_FORMATS:
            try:
                found.update(write(os.path.join(out, name), (name,)))
            except RuntimeError as error:
                found[name] = f"fails in LiteRT: {' '.join(str(error).split())}"
        return found


def litert_latency(models: dict, folder: str, sample, representative, args) -> dict:
    """Per label, each TFLite file's batch-1 milliseconds in LiteRT (timed in turns) or why it
    has none, and the int8 file's top-1 agreement with the Keras model on sample."""
    from vit_keras import export

    calls, rows = {}, {}
    for label, (_, model) in models.items():
        files = litert_files(model, os.path.join(folder, label.replace(" ", "_").replace(
            "=", "")), sample, representative)
        rows[label] = {"int8_top1_agreement": None}
        for name, line in files.items():
            key = f"litert_{name.split('_')[1]}"
            if isinstance(line, str):
                rows[label].update({f"{key}_ms": None, f"{key}_error": line})
                continue
            predictor = export.Predictor(line["path"])
            calls[(label, key)] = lambda predictor=predictor: predictor(sample[:1])
            if name == "tflite_int8":
                rows[label]["int8_top1_agreement"] = line["top1_agreement"]
    seconds = timed_in_turns(calls, args.repeats, args.warmup, args.min_sample)
    for (label, key), value in seconds.items():
        rows[label][f"{key}_ms"] = 1000 * value
    return rows


def speed_rows(subject: str, config: vk.ViTConfig, models: dict, image_size: int, batch: int,
               args, litert: tuple | None = None, memory: dict | None = None) -> list[dict]:
    """One subject's rows: tokens per block, FLOPs, Keras throughput and batch-1 latency
    (timed in turns), LiteRT latencies (litert: (folder, sample uint8 images, calibration
    images)) and peak memory in a child process each (memory: its spec), each rate also as
    a speed-up over the unreduced row."""
    runners = {label: keras_runner(lambda model=model: model, image_size, "float32", batch)
               for label, (_, model) in models.items()}
    timed, _ = measure_in_turns(runners, batch, args.repeats, args.warmup, train=False,
                                min_sample_s=args.min_sample)
    lite = litert_latency(models, *litert, args) if litert else {}
    rows = []
    for label, (row, model) in models.items():
        counts = token_counts(model)
        rows.append({
            "model": subject, **row, "label": label, "image_size": image_size, "batch": batch,
            "tokens_per_block": counts,
            "gflops_per_image": forward_flops(config, image_size, counts, row["method"] == "ToMe",
                                              model.output.shape[-1]) / 1e9,
            "infer_images_s": timed[label]["infer_images_s"],
            "latency_ms": timed[label]["latency_ms"], **lite.get(label, {}),
            "infer_peak_mib": (run_child({**memory, **row}, {}, "benchmarks.token_budget")
                               ["infer_peak_mib"] if memory else None)})
        print(f"{subject:>24} {label:>14}: {rows[-1]['infer_images_s']:8.1f} img/s, "
              f"{rows[-1]['latency_ms']:7.1f} ms", flush=True)
    return with_speedups(rows)


SPEEDUPS = {"speedup": ("infer_images_s", 1), "latency_speedup": ("latency_ms", -1),
            "litert_float32_speedup": ("litert_float32_ms", -1),
            "litert_int8_speedup": ("litert_int8_ms", -1), "flop_ratio": ("gflops_per_image", -1)}


def with_speedups(rows: list[dict]) -> list[dict]:
    """Each row with its rates over the unreduced row's (times for durations and FLOPs: the
    unreduced one's over the row's), and the int8 file's speed-up over Keras' throughput's."""
    base = next(row for row in rows if row["method"] == "none")
    for row in rows:
        for name, (key, power) in SPEEDUPS.items():
            row[name] = (row[key] / base[key]) ** power if row.get(key) is not None else None
        row["int8_over_keras"] = (row["litert_int8_speedup"] / row["speedup"]
                                  if row["litert_int8_speedup"] is not None else None)
    return rows


def run_speed(args) -> dict:
    from benchmarks.machine import describe_machine

    run = finetune_args(args, 1.0)
    fashion = fine_tuned_models(args)
    sample = fashion_images(args, AGREEMENT_IMAGES)
    tensorflow = keras.backend.backend() == "tensorflow"
    rows = speed_rows(f"fashion_mnist_p4, {args.image_size} px (fine-tuned)", model_config(run),
                      fashion, args.image_size, args.batch, args,
                      litert=(os.path.join(args.out, "exports", "fashion_mnist"), sample,
                              sample[:64]) if tensorflow else None)
    batches = dict(zip(args.variants, args.variant_batch * len(args.variants)
                       if len(args.variant_batch) == 1 else args.variant_batch, strict=True))
    for variant in args.variants:
        models = variant_models(variant, args.variant_image_size, args.variant_r,
                                args.keep_rates)
        size = model_spec(variant, args.variant_image_size)[1]
        images = np.random.default_rng(0).integers(0, 256, (4, size, size, 3), dtype="uint8")
        litert = (os.path.join(args.out, "exports", variant.replace("/", "_")), images[:2],
                  images) if tensorflow and variant in args.litert_variants else None
        rows += speed_rows(f"{variant}, {size} px (random weights)",
                           model_spec(variant, size)[0], models, size,
                           batches[variant], args, litert,
                           memory={"variant": variant, "image_size": size,
                                   "batch": batches[variant]})
        del models
        keras.backend.clear_session()
    return {"machine": describe_machine(), "backend": keras.backend.backend(),
            "jit_compile": "auto", "repeats": args.repeats, "warmup": args.warmup,
            "min_sample_s": args.min_sample, "litert_threads": "the interpreter's default",
            "fine_tuned_in": args.out, "rows": rows}


def memory_child(spec: dict) -> dict:
    """The first inference call's peak memory of one variant row, in this process alone."""
    config, size = model_spec(spec["variant"], spec["image_size"])
    model = reduce(vk.vit(config, image_size=size, num_classes=1000), spec)
    runner = keras_runner(lambda: model, size, "float32", spec["batch"])
    return peak_memory_of(runner, train=False)


# --- the plot -------------------------------------------------------------------------------

def plot(json_dir: str) -> str | None:
    """Validation accuracy against the Keras throughput speed-up of the Fashion-MNIST rows,
    merging off the shelf and pruning fine-tuned on the same axes (off-the-shelf pruning, far
    below, is in the table only), from the reports in json_dir, as tradeoff.png; None (and a
    line saying so) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return None
    with open(os.path.join(json_dir, ACCURACY_FILE)) as file:
        accuracy = json.load(file)
    with open(os.path.join(json_dir, SPEED_FILE)) as file:
        speed = json.load(file)
    speedups = {row["label"]: row["speedup"] for row in speed["rows"]
                if row["model"].startswith("fashion_mnist")}
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    base = next(row for row in accuracy["rows"] if row["method"] == "none")
    for method, training, style in (("ToMe", "off the shelf", "o-"),
                                    ("EViT", "fine-tuned", "s-")):
        rows = [base] + [row for row in accuracy["rows"]
                         if row["method"] == method and row["training"] == training]
        axes.plot([speedups[row["label"]] for row in rows],
                  [100 * row["validation_accuracy"] for row in rows], style,
                  label=f"{method} ({training})")
        for row in rows[1:]:
            axes.annotate(row["label"].split(" ", 1)[1],
                          (speedups[row["label"]], 100 * row["validation_accuracy"]),
                          textcoords="offset points", xytext=(4, 4), fontsize=7)
    axes.plot([1.0], [100 * base["validation_accuracy"]], "k*", markersize=10,
              label="unreduced")
    axes.axvline(1.5, color="grey", lw=0.8, ls="--")
    axes.axhline(100 * base["validation_accuracy"] - 0.5, color="grey", lw=0.8, ls="--")
    axes.set_xlabel("throughput over the unreduced model (Keras, batch "
                    f"{speed['rows'][0]['batch']})")
    axes.set_ylabel("validation accuracy (%)")
    axes.set_title(f"Fashion-MNIST at {accuracy['image_size']} px (196 patches): the aim is "
                   "right of and above the dashed lines", fontsize=9)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path = os.path.join(json_dir, PLOT_FILE)
    figure.savefig(path, dpi=110)
    return path


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.memory_child:
        result = memory_child(json.loads(args.memory_child)["spec"])
        print(json.dumps(result))
        return result
    if args.smoke:
        smoke(args)
    from benchmarks import render

    reports = {}
    if "accuracy" in args.parts:
        reports[ACCURACY_FILE] = run_accuracy(args)
        write_json(reports[ACCURACY_FILE], args.json_dir and os.path.join(args.json_dir,
                                                                           ACCURACY_FILE))
    if "speed" in args.parts:
        reports[SPEED_FILE] = run_speed(args)
        write_json(reports[SPEED_FILE], args.json_dir and os.path.join(args.json_dir,
                                                                        SPEED_FILE))
    paths = [os.path.join(args.json_dir or "", name) for name in (ACCURACY_FILE, SPEED_FILE)]
    if args.json_dir and all(map(os.path.exists, paths)):
        print("\n\n".join(spec.render([render.read(path) for path in paths])
                           for spec in render.BLOCKS["token-budget"]))
        plot(args.json_dir)
    return reports


if __name__ == "__main__":
    main()
