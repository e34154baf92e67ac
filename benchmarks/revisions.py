"""Compares the speed of two source trees of vit_keras (before and after a change) on this
machine: float32 inference and training images/s of the same variants, each measurement in a
fresh process that imports vit_keras from its tree, the trees alternating so that neither
always runs first.

python -m benchmarks.revisions --before DIR --after DIR [--variants Ti/16 B/16 main]
    [--backends tensorflow jax torch] [--rounds 2] [--jit-compile auto] [--batch N]
    [--samples 5] [--warmup 2] [--skip-training] [--smoke] [--json out.json]

The child uses only API both trees have: vk.vit, model.compile, predict_on_batch and
train_on_batch. A round runs every (backend, variant) once per tree, before then after in even
rounds, after then before in odd ones; a tree's rate is the median over rounds of each run's
median over --samples timed calls.
"""

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys

from apps.train import MAIN_JOB_MODEL
from benchmarks import JIT_COMPILE, SMOKE_IMAGE_SIZE, SMOKE_MODEL, revision, write_json
from benchmarks.machine import describe_host
from benchmarks.runners import MAIN_JOB_CONFIG

TREES = ("before", "after")
BATCH = {"Ti/16": 32, "B/16": 8, "main": 128}  # --batch overrides; other variants get 32
# "main": the main job's shape, its ResNet included, at its image size (the child's own head
# and position embedding).
MODELS = {"main": (dataclasses.asdict(MAIN_JOB_CONFIG), MAIN_JOB_MODEL["image_size"])}

CHILD = r"""
import json, sys, time
spec = json.loads(sys.argv[1])
if spec["backend"] == "torch":
    import torch._dynamo  # noqa: F401  before TensorFlow, or torch.compile segfaults
import keras
import numpy as np
import vit_keras as vk

keras.config.set_dtype_policy("float32")
model = vk.vit(spec["model"], image_size=spec["image_size"], num_classes=1000)
model.compile(keras.optimizers.Adam(1e-4), keras.losses.CategoricalCrossentropy(from_logits=True),
              jit_compile=spec["jit_compile"])
rng = np.random.default_rng(0)
x = rng.uniform(-1, 1, (spec["batch"], spec["image_size"], spec["image_size"], 3))
x = x.astype("float32")
y = np.eye(1000, dtype="float32")[np.arange(spec["batch"]) % 1000]

def seconds(call):
    for _ in range(spec["warmup"]):
        call()
    samples = []
    for _ in range(spec["samples"]):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples

result = {"vit_keras": vk.__file__, "params": model.count_params(),
          "jit_compile": model.jit_compile,
          "infer_s": seconds(lambda: model.predict_on_batch(x)),
          "train_s": None if spec["skip_training"] else seconds(
              lambda: model.train_on_batch(x, y))}
print(json.dumps(result))
"""


def order(round_: int) -> tuple[str, str]:
    """The trees' order in a round: before first in even rounds, after first in odd ones."""
    return TREES if round_ % 2 == 0 else TREES[::-1]


def run_child(tree: str, spec: dict) -> dict:
    """One measurement in a fresh process whose vit_keras comes from tree."""
    env = {**os.environ, "PYTHONPATH": tree, "KERAS_BACKEND": spec["backend"]}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the run of {spec} in {tree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    if os.path.commonpath([os.path.realpath(result["vit_keras"]), tree]) != tree:
        raise RuntimeError(f"the run in {tree} imported vit_keras from {result['vit_keras']}")
    return result


def specs(args):
    """Every (backend, model) measurement's spec, in the order they run."""
    variants = ["smoke"] if args.smoke else args.variants
    models = {"smoke": (SMOKE_MODEL, SMOKE_IMAGE_SIZE), **MODELS}
    for backend in args.backends:
        for variant in variants:
            model, image_size = models.get(variant, (variant, 224))
            yield {"backend": backend, "variant": variant, "model": model,
                   "image_size": image_size,
                   "batch": args.batch or (2 if args.smoke else BATCH.get(variant, 32)),
                   "jit_compile": JIT_COMPILE[args.jit_compile], "samples": args.samples,
                   "warmup": args.warmup, "skip_training": args.skip_training}


def summarise(runs: list[dict], spec: dict) -> dict:
    """Per kind (infer, train), each tree's images/s (the median over rounds of each run's
    median), after/before, and the spread: the larger tree's (max - min) / median over rounds,
    the noise a ratio must exceed to mean anything."""
    summary = {"backend": spec["backend"], "variant": spec["variant"], "batch": spec["batch"]}
    for kind in ("infer", "train"):
        if runs[0][f"{kind}_s"] is None:
            continue
        rates = {tree: [spec["batch"] / statistics.median(run[f"{kind}_s"])
                        for run in runs if run["tree"] == tree] for tree in TREES}
        medians = {tree: statistics.median(rates[tree]) for tree in TREES}
        summary[kind] = {**{f"{tree}_images_s": medians[tree] for tree in TREES},
                         "ratio": medians["after"] / medians["before"],
                         "spread": max((max(rates[tree]) - min(rates[tree])) / medians[tree]
                                       for tree in TREES)}
    return summary


def print_summary(summary: dict):
    for kind in ("infer", "train"):
        if kind in summary:
            s = summary[kind]
            print(f"{summary['backend']:<10} {summary['variant']:<6} b{summary['batch']:<3} "
                  f"{kind:<5} before {s['before_images_s']:9.2f}  after {s['after_images_s']:9.2f}"
                  f" img/s  after/before {s['ratio']:.3f}  spread {s['spread']:.1%}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="source tree of the baseline")
    parser.add_argument("--after", required=True, help="source tree of the change")
    parser.add_argument("--variants", nargs="+", default=["Ti/16", "B/16"])
    parser.add_argument("--backends", nargs="+", choices=["tensorflow", "jax", "torch"],
                        default=[os.environ.get("KERAS_BACKEND", "tensorflow")])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jit-compile", choices=list(JIT_COMPILE), default="auto",
                        help="model.compile's jit_compile in both trees")
    parser.add_argument("--batch", type=int,
                        help=f"batch size of every variant (default: {BATCH}, else 32)")
    parser.add_argument("--samples", type=int, default=5, help="timed calls per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before them")
    parser.add_argument("--skip-training", action="store_true", help="inference only")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model at 32 px, batch 2: checks the comparison runs")
    parser.add_argument("--json", help="write the runs and the summary here")
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    trees = {"before": os.path.realpath(args.before), "after": os.path.realpath(args.after)}
    report = {"trees": trees, "revisions": {t: revision(d) for t, d in trees.items()},
              "machine": describe_host(), "jit_compile": args.jit_compile,
              "rounds": args.rounds, "runs": [], "summary": []}
    for spec in specs(args):
        runs = []
        for round_ in range(args.rounds):
            for tree in order(round_):
                runs.append({**spec, "tree": tree, "round": round_,
                             **run_child(trees[tree], spec)})
        report["runs"] += runs
        report["summary"].append(summarise(runs, spec))
        print_summary(report["summary"][-1])
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
