"""The paper's Appendix D.2 at Fashion-MNIST scale: where twice the training compute pays
most. The experiments' model (benchmarks.ablation.EXPERIMENT_SHAPE) trained for twice the
epochs, against three shapes that each cost about twice its FLOPs per image, trained for the
base epochs: deeper (8 blocks), wider (width 96) and smaller patches (2x2 pixels, four times
the tokens, at half the width so that the cost stays at about twice). The cost is counted
analytically (runners.forward_flops).

python -m benchmarks.shape [--epochs 1] [--shapes NAME ...] [--out runs/shape] [--limit N]
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
from benchmarks.ablation import EXPERIMENT_IMAGE_SIZE, EXPERIMENT_SHAPE, train_run
from benchmarks.machine import describe_host
from benchmarks.runners import forward_flops

# name: (changes to the base shape, epochs as a multiple of --epochs); heads stay 16 wide.
SHAPES = {
    "base": ({}, 1),
    "base, twice the epochs": ({}, 2),
    "deeper": ({"num_layers": 8}, 1),
    "wider": ({"hidden_size": 96, "num_heads": 6, "mlp_dim": 192}, 1),
    "smaller patches": ({"patch_size": 2, "hidden_size": 32, "num_heads": 2, "mlp_dim": 64}, 1),
}


def run_folder(name: str) -> str:
    return name.replace(",", "").replace(" ", "_")


def shape_flags(shape: dict) -> list[str]:
    return [flag for key, value in shape.items()
            for flag in ("--" + key.replace("_", "-"), str(value))]


def costs(base_epochs: int) -> dict:
    """Each shape's model, epochs, forward MFLOP per image and training compute (FLOPs per
    image x epochs) relative to the base's."""
    def flops(shape):
        return forward_flops(vk.ViTConfig(**shape), EXPERIMENT_IMAGE_SIZE,
                             num_classes=MAIN_JOB_MODEL["num_classes"], class_token=False)

    base = flops(EXPERIMENT_SHAPE) * base_epochs
    plans = {}
    for name, (changes, epoch_factor) in SHAPES.items():
        shape, epochs = {**EXPERIMENT_SHAPE, **changes}, base_epochs * epoch_factor
        plans[name] = {"shape": shape, "epochs": epochs,
                       "tokens": (EXPERIMENT_IMAGE_SIZE // shape["patch_size"]) ** 2,
                       "forward_mflop_per_image": round(flops(shape) / 1e6, 2),
                       "training_cost": round(flops(shape) * epochs / base, 2)}
    return plans


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--out", default=os.path.join("runs", "shape"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    runs = {}
    for name, plan in costs(args.epochs).items():
        if name not in args.shapes:
            continue
        result = train_run([*shape_flags(plan["shape"]), "--epochs", str(plan["epochs"])],
                           os.path.join(args.out, run_folder(name)), args.limit)
        runs[name] = {**plan, "trainable_parameters": result["trainable_parameters"],
                      "test_accuracy": result["test_accuracy"],
                      "fit_seconds": result["fit_seconds"]}
    report = {"machine": describe_host(), "backend": keras.backend.backend(),
              "base_epochs": args.epochs, "limit": args.limit, "runs": runs}
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
