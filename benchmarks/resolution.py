"""The paper's fine-tuning at a higher resolution (Section 3.2) at Fashion-MNIST scale: a main
job's trained model (4x4-pixel patches, docs/models/fashion_mnist_p4.keras) fine-tuned at a
larger image size (more patches of the same size, the position embeddings fitted to the new
grid), against fine-tuning it at 28 px for about as long (the same number of training images
seen times the token ratio).

python -m benchmarks.resolution [--model docs/models/fashion_mnist_p4.keras] [--image-size 40]
    [--epochs 1] [--recipe fashion_mnist] [--learning-rate 3e-4] [--out runs/resolution]
    [--limit N] [--json docs/paper/resolution.json]
"""

import argparse
import os

import keras

from apps import finetune
from benchmarks import limit_flags, write_json
from benchmarks.machine import describe_host

# fashion_mnist_p4.keras's patch and image size, and the patch dropout its recipe had then
PATCH_SIZE, BASE_SIZE, PATCH_DROP_RATE = 4, 28, 0.5


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model",
                        default=os.path.join("docs", "models", "fashion_mnist_p4.keras"))
    parser.add_argument("--image-size", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--recipe", default="fashion_mnist")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--out", default=os.path.join("runs", "resolution"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    limit = limit_flags(args.limit)
    tokens = (args.image_size // PATCH_SIZE) ** 2 / (BASE_SIZE // PATCH_SIZE) ** 2
    base_epochs = max(round(args.epochs * tokens), 1)
    runs = {}
    for size, epochs in ((args.image_size, args.epochs), (BASE_SIZE, base_epochs)):
        keras.utils.set_random_seed(0)
        runs[f"{size}px"] = finetune.main([
            args.model, "--resnet-layers", "none", "--image-size", str(size),
            "--patch-size", str(PATCH_SIZE),
            "--recipe", args.recipe, "--recipe-option", f"patch_drop_rate={PATCH_DROP_RATE}",
            "--learning-rate", str(args.learning_rate), "--epochs", str(epochs),
            "--run-dir", os.path.join(args.out, f"{size}px"), *limit])
    report = {"machine": describe_host(), "backend": keras.backend.backend(),
              "model": args.model, "recipe": args.recipe, "learning_rate": args.learning_rate,
              "token_ratio": round(tokens, 3),
              "runs": runs}
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
