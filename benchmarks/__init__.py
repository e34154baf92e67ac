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


def revision(tree: str) -> str | None:
    """`git describe --always --dirty` of the tree, or None outside a git checkout."""
    done = subprocess.run(["git", "-C", tree, "describe", "--always", "--dirty"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or None
