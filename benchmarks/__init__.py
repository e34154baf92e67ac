"""Speed and memory of vit_keras against its peers, and of two source trees against each other.

Not installed: run from the repository root (`python -m benchmarks.bench`).
"""

import json
import os
import subprocess

# The tiny model of every --smoke run: checks that a benchmark runs, measures nothing.
SMOKE_MODEL = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, patch_size=8)
SMOKE_IMAGE_SIZE = 32
# The host-overhead model: B/16's depth at a tiny width, where a step's time is nearly all
# framework overhead (python -m benchmarks.bench --variants overhead).
OVERHEAD_MODEL = dict(hidden_size=64, num_layers=12, num_heads=4, mlp_dim=128, patch_size=16)
OVERHEAD_IMAGE_SIZE = 32
# --jit-compile's values: model.compile's jit_compile ("auto" leaves the choice to Keras).
JIT_COMPILE = {"auto": "auto", "true": True, "false": False}


def limit_flags(limit: int | None) -> list[str]:
    """The apps' flags for a smoke run on `limit` training and held-out images (none: all)."""
    return ["--limit", str(limit), "--eval-limit", str(limit)] if limit else []


def write_json(report, path: str | None) -> None:
    """The report as indented JSON at `path`, where one is given (--json), its folder made."""
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as file:
            json.dump(report, file, indent=1)


def finished_or_trained(argv: list[str]) -> dict:
    """apps.train's result of the run that argv describes: read where it finished with these
    arguments (a finished run of other arguments there is refused by name), else trained,
    resumed where it was interrupted."""
    import keras

    from apps import train

    result = train.finished_result(argv)
    if result is None:
        result = train.main(argv)
        keras.backend.clear_session()
    return result


def scored_on_test(model_path: str, limit: int | None = None) -> dict:
    """vit-keras evaluate's report of the model on the test split (single views; the first
    `limit` images where given), kept in test/evaluation.json beside the model and read from
    there after: the test split is read once per model, however often a benchmark resumes."""
    import keras

    from apps import evaluate

    out = os.path.join(os.path.dirname(model_path), "test")
    path = os.path.join(out, "evaluation.json")
    if not os.path.exists(path):
        evaluate.main([model_path, "--out", out, *(["--limit", str(limit)] if limit else [])])
        keras.backend.clear_session()
    with open(path) as file:
        return json.load(file)


def revision(tree: str) -> str | None:
    """`git describe --always --dirty` of the tree, or None outside a git checkout."""
    done = subprocess.run(["git", "-C", tree, "describe", "--always", "--dirty"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or None
