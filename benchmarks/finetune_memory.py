"""Peak memory of training steps with and without rematerialisation and LoRA, each setting in
a process of its own (the peak resident set size is per process).

python -m benchmarks.finetune_memory [--variant B/16] [--batch 32] [--steps 2] [--json out.json]

Run it once per backend (KERAS_BACKEND=...). "peak MiB" is the process's peak resident set
size after the training steps; "model MiB" the resident size once the model is built and
compiled, before any step; their difference is what training added.
"""

import argparse
import json
import os
import resource
import subprocess
import sys

from benchmarks import write_json

SETTINGS = {"full": {}, "remat": {"remat": True}, "lora": {"lora_rank": 8}}


def resident_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def measure(variant: str, setting: str, batch: int, steps: int) -> dict:
    """In this process: build, compile, run `steps` training steps; memory figures."""
    import keras
    import numpy as np

    import vit_keras as vk

    options = dict(SETTINGS[setting])
    rank = options.pop("lora_rank", None)
    model = vk.vit(variant, num_classes=1000, **options)
    if rank:
        vk.lora(model, rank=rank)
    model.compile(keras.optimizers.AdamW(1e-4),
                  keras.losses.CategoricalCrossentropy(from_logits=True))
    size = model.input.shape[1]
    x = np.random.default_rng(0).uniform(-1, 1, (batch, size, size, 3)).astype("float32")
    y = np.eye(1000, dtype="float32")[np.arange(batch)]
    before = resident_mib()
    for _ in range(steps):
        model.train_on_batch(x, y)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    return {"backend": keras.backend.backend(), "variant": variant, "setting": setting,
            "batch": batch, "model_mib": round(before), "peak_mib": round(peak),
            "trainable_parameters": trainable}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="B/16", help="the model to train")
    parser.add_argument("--batch", type=int, default=32, help="images per training step")
    parser.add_argument("--steps", type=int, default=2, help="training steps per setting")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                        help="which settings to measure")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.variant, args.child, args.batch, args.steps)))
        return None
    rows = []
    for setting in args.settings:
        done = subprocess.run([sys.executable, "-m", "benchmarks.finetune_memory", "--variant",
                               args.variant, "--batch", str(args.batch), "--steps",
                               str(args.steps), "--child", setting],
                              capture_output=True, text=True, env=os.environ)
        if done.returncode:
            raise SystemExit(f"{setting} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    write_json(rows, args.json)
    return rows


if __name__ == "__main__":
    main()
