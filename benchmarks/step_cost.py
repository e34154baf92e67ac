"""What a training step of the main job costs on the current Keras backend: the model and
optimizer exactly as `vit-keras train` builds them (the main job's defaults), timed with
model.train_on_batch at a small and at the main job's batch. The line through the two splits a
step into a fixed cost per step (the backend's dispatch, whatever the batch) and a cost per
image (the arithmetic), which explains why one backend's epoch takes longer than another's.

KERAS_BACKEND=... python -m benchmarks.step_cost [--batches 8 128] [--repeats 7]
    [--json docs/mainjob/steps/BACKEND.json]
"""

import argparse

import keras
import numpy as np

from apps import common, train
from benchmarks import write_json
from benchmarks.machine import describe_host
from benchmarks.runners import TRAIN_FLOPS_PER_FORWARD, forward_flops
from benchmarks.timing import timed_in_turns
from vit_keras import distribute, training

CLASSES = train.MAIN_JOB_MODEL["num_classes"]  # Fashion-MNIST's


def main_job_model(argv: list[str]):
    """The main job's model, compiled with its recipe, and its parsed arguments."""
    args = train.build_parser().parse_args(argv)
    train.fill_defaults(args)
    recipe = train.recipe_from_arguments(args)
    keras.config.set_dtype_policy(args.precision)  # as run_training sets it
    model = train.build_model(args, recipe, CLASSES, distribute.choose("none"))
    training.compile_model(model, recipe, total_steps=10**6,
                           jit_compile=train.JIT_COMPILE[args.jit_compile])
    return model, args


def step_call(model, batch: int, image_size: int):
    """One training step of model on a batch of random images and labels, as a call."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    y = np.eye(CLASSES, dtype="float32")[rng.integers(0, CLASSES, batch)]
    return lambda: model.train_on_batch(x, y)


def step_seconds(model, batches: list[int], image_size: int, repeats: int) -> dict[int, float]:
    """Median seconds of one training step at each batch size."""
    calls = {batch: step_call(model, batch, image_size) for batch in batches}
    return timed_in_turns(calls, repeats=repeats, warmup=3, min_sample_s=0.5)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs=2, default=[8, 128])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args, flags = parser.parse_known_args(argv)
    model, run = main_job_model(flags)
    seconds = step_seconds(model, args.batches, run.image_size, args.repeats)
    small, large = args.batches
    per_image = (seconds[large] - seconds[small]) / (large - small)
    config = common.model_config(run)  # the hybrid's ResNet included
    train_flops = TRAIN_FLOPS_PER_FORWARD * forward_flops(
        config, run.image_size, CLASSES, class_token=run.classifier == "token")
    report = {"backend": keras.backend.backend(), "machine": describe_host(),
              "jit_compile": run.jit_compile, "precision": run.precision,
              "command_flags": flags,
              "ms_per_step": {str(b): round(1000 * s, 2) for b, s in seconds.items()},
              "fixed_ms_per_step": round(1000 * (seconds[small] - small * per_image), 2),
              "ms_per_image": round(1000 * per_image, 4),
              "train_gflop_per_image": round(train_flops / 1e9, 5),
              "gflop_s_at_large_batch": round(large * train_flops / seconds[large] / 1e9, 1)}
    write_json(report, args.json)
    print(report)
    return report


if __name__ == "__main__":
    main()
