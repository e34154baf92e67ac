"""The paper's Table 8 (Appendix D.4) at Fashion-MNIST scale: the main job's model with each
kind of position embedding, over seeds, scored by test accuracy and by the paper's own measure,
5-shot linear accuracy of the frozen representation.

python -m benchmarks.posemb [--kinds none learned learned2d relative sincos2d] [--seeds 0 1]
    [--epochs 2] [--out runs/posemb] [--limit N] [--json docs/paper/posemb.json]

Runs under the current KERAS_BACKEND; --limit uses only N training and test images (a smoke
run). A kind's finished run is read, not trained again.
"""

import argparse
import os

import keras

from benchmarks import write_json
from benchmarks.ablation import five_shot, train_run
from benchmarks.machine import describe_host

KINDS = ("none", "learned", "learned2d", "relative", "sincos2d")
# Table 8: ViT-B/16 pre-trained on ImageNet, ImageNet 5-shot linear accuracy.
PAPER_FIVE_SHOT = {"none": 0.61382, "learned": 0.64206, "learned2d": 0.64001,
                   "relative": 0.64032}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=os.path.join("runs", "posemb"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    runs = {}
    for kind in args.kinds:
        for seed in args.seeds:
            run_dir = os.path.join(args.out, f"{kind}_seed{seed}")
            result = train_run(["--posemb", kind, "--seed", str(seed),
                                "--epochs", str(args.epochs)], run_dir, args.limit)
            runs.setdefault(kind, []).append({
                "seed": seed, "test_accuracy": result["test_accuracy"],
                "five_shot": five_shot(result["model"], args.limit),
                "fit_seconds": result["fit_seconds"]})
    report = {"machine": describe_host(), "backend": keras.backend.backend(),
              "epochs": args.epochs, "limit": args.limit, "paper_five_shot": PAPER_FIVE_SHOT,
              "runs": runs}
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
