"""The main job over seeds: `bash scripts/main.sh --seed N` for each seed, one after another
(each alone on the machine, so its minutes are its own), then the seeds' results, their mean
and spread, and the machine in docs/mainjob/seeds.json, and the first seed's run files in
docs/mainjob/. A seed whose run directory already holds a result is not run again.

python -m benchmarks.mainjob [--seeds 0 1 2] [--out runs/mainjob] [--docs docs/mainjob]
    [any apps.train flag, passed to every seed]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess

from benchmarks import write_json
from benchmarks.machine import describe_host

RUN_FILES = ("history.csv", "history.json", "labels.txt", "model.keras", "result.json")


def run_seed(seed: int, run_dir: str, flags: list[str]) -> dict:
    """The seed's result.json, from its run directory or from a new run of the main job."""
    path = os.path.join(run_dir, "result.json")
    if not os.path.exists(path):
        subprocess.run(["bash", "scripts/main.sh", "--seed", str(seed), "--run-dir", run_dir,
                        *flags], check=True)
    with open(path) as file:
        return json.load(file)


def summarise(results: dict[str, dict]) -> dict:
    """Mean, smallest and largest test accuracy and minutes over the seeds' results."""
    accuracy = [r["test_accuracy"] for r in results.values()]
    fit_minutes = [r["fit_seconds"] / 60 for r in results.values()]
    total_minutes = [r["total_seconds"] / 60 for r in results.values()]
    return {"mean_test_accuracy": round(statistics.mean(accuracy), 4),
            "min_test_accuracy": min(accuracy), "max_test_accuracy": max(accuracy),
            "mean_fit_minutes": round(statistics.mean(fit_minutes), 2),
            "max_fit_minutes": round(max(fit_minutes), 2),
            "mean_total_minutes": round(statistics.mean(total_minutes), 2)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=os.path.join("runs", "mainjob"))
    parser.add_argument("--docs", default=os.path.join("docs", "mainjob"))
    args, flags = parser.parse_known_args(argv)
    run_dirs = {seed: os.path.join(args.out, f"seed{seed}") for seed in args.seeds}
    results = {str(seed): run_seed(seed, run_dir, flags) for seed, run_dir in run_dirs.items()}
    report = {"command": " ".join(["bash scripts/main.sh --seed N", *flags]),
              "machine": describe_host(),
              "backend": os.environ.get("KERAS_BACKEND", "tensorflow"),  # as scripts/main.sh
              "epochs": results[str(args.seeds[0])]["epochs"], **summarise(results),
              "seeds": {seed: {k: r[k] for k in ("test_accuracy", "fit_seconds",
                                                  "total_seconds")}
                        for seed, r in results.items()}}
    os.makedirs(args.docs, exist_ok=True)
    for name in RUN_FILES:
        shutil.copy(os.path.join(run_dirs[args.seeds[0]], name), os.path.join(args.docs, name))
    write_json(report, os.path.join(args.docs, "seeds.json"))
    return report


if __name__ == "__main__":
    main()
