"""The paper's Appendix D.3 at Fashion-MNIST scale: the main job's model classifying from a
class token or from the global average of the patch tokens, each at several learning rates.
The rates are compared on a validation split carved from the training images; only each
classifier's best rate is then scored on the test split, once.

python -m benchmarks.pooling [--classifiers token gap] [--learning-rates 1e-3 3e-3 1e-2]
    [--epochs 2] [--validation-split 10000] [--out runs/pooling] [--limit N]
    [--json docs/paper/pooling.json]

Runs under the current KERAS_BACKEND; --limit uses only N training images (a smoke run; the
chosen rates are still scored on every test image). A finished run is read, not trained again.
"""

import argparse
import os

import keras

from benchmarks import scored_on_test, write_json
from benchmarks.ablation import train_run
from benchmarks.machine import describe_host


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classifiers", nargs="+", choices=["token", "gap"],
                        default=["token", "gap"])
    parser.add_argument("--learning-rates", nargs="+", type=float, default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--validation-split", type=int, default=10_000)
    parser.add_argument("--out", default=os.path.join("runs", "pooling"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    runs, chosen = {}, {}
    for classifier in args.classifiers:
        for rate in args.learning_rates:
            result = train_run(["--classifier", classifier, "--learning-rate", str(rate),
                                "--epochs", str(args.epochs),
                                "--validation-split", str(args.validation_split)],
                               os.path.join(args.out, f"{classifier}_lr{rate:g}"), args.limit)
            runs.setdefault(classifier, []).append({
                "learning_rate": rate, "validation_accuracy": result["validation_accuracy"],
                "fit_seconds": result["fit_seconds"], "model": result["model"]})
        best = max(runs[classifier], key=lambda run: run["validation_accuracy"])
        chosen[classifier] = {
            "learning_rate": best["learning_rate"],
            "test_accuracy": round(scored_on_test(best["model"])["top1"], 4)}
    report = {"machine": describe_host(), "backend": keras.backend.backend(),
              "epochs": args.epochs, "validation_split": args.validation_split,
              "limit": args.limit,
              "runs": runs, "chosen_on_validation": chosen}
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
