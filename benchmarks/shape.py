"""The paper's Appendix D.2 at Fashion-MNIST scale: where twice the main job's training compute
pays most. The main job's model trained for twice the epochs, against three shapes that each
cost about twice its FLOPs per image, trained for the base epochs: deeper (8 blocks), wider
(width 96) and smaller patches (2x2 pixels, four times the tokens, at half the width so that
the cost stays at about twice). The cost is counted analytically (runners.forward_flops).

python -m benchmarks.shape [--epochs 2] [--out runs/shape] [--limit N]
    [--json docs/paper/shape.json]

Runs under the current KERAS_BACKEND; --limit uses only N training and test images (a smoke
run). A finished run is read, not trained again.
"""

import argparse
import os

import keras

import vit_keras as vk
from apps.train import MAIN_JOB_MODEL
from benchmarks import write_json
from benchmarks.ablation import train_run
from benchmarks.machine import describe_host
from benchmarks.runners import forward_flops

BASE = {key: MAIN_JOB_MODEL[key] for key in
        ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size")}
# name: (changes to the base shape, epochs as a multiple of --epochs); heads stay 16 wide.
SHAPES = {
    "base": ({}, 1),
    "base, twice the epochs": ({}, 2),
    "deeper": ({"num_layers": 8}, 1),
    "wider": ({"hidden_size": 96, "num_heads": 6, "mlp_dim": 192}, 1),
    "smaller patches": ({"patch_size": 2, "hidden_size": 32, "num_heads": 2, "mlp_dim": 64}, 1),
}


def shape_flags(shape: dict) -> list[str]:
    return [flag for key, value in shape.items()
            for flag in ("--" + key.replace("_", "-"), str(value))]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=os.path.join("runs", "shape"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    image_size, base_flops = MAIN_JOB_MODEL["image_size"], None
    runs = {}
    for name, (changes, epoch_factor) in SHAPES.items():
        shape, epochs = {**BASE, **changes}, args.epochs * epoch_factor
        flops = forward_flops(vk.ViTConfig(**shape), image_size, num_classes=10,
                              class_token=False)
        base_flops = base_flops or flops
        result = train_run([*shape_flags(shape), "--epochs", str(epochs)],
                           os.path.join(args.out, name.replace(" ", "_").replace(",", "")),
                           args.limit)
        runs[name] = {"shape": shape, "epochs": epochs,
                      "forward_mflop_per_image": round(flops / 1e6, 2),
                      # FLOPs per image x epochs, relative to the base's
                      "training_cost": round(flops * epochs / (base_flops * args.epochs), 2),
                      "trainable_parameters": result["trainable_parameters"],
                      "test_accuracy": result["test_accuracy"],
                      "fit_seconds": result["fit_seconds"]}
    report = {"machine": describe_host(), "backend": keras.backend.backend(),
              "base_epochs": args.epochs, "runs": runs}
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
