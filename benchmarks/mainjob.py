"""The Fashion-MNIST reference run over seeds: `bash scripts/main.sh --seed N` for each seed,
one after another (each alone on the machine, so its minutes are its own), then the seeds'
results, their mean and spread, and the machine in docs/mainjob/seeds.json, and the first
seed's run files in docs/mainjob/. A seed whose run directory holds a run finished with the
same arguments on the same backend from the same code revision is not run again; any other
finished run there is refused.

One try of a recipe change, scored on a validation split carved from the training images so
that the choice leaves the test split unread, goes to notes/mainjob/tries/NAME.json (the run's
result with its command, per-epoch seconds and the machine) and NAME.history.json: the
research record, beside the earlier tries (--docs DIR: DIR/tries/).

python -m benchmarks.mainjob [--seeds 0 1 2] [--out runs/mainjob] [--docs docs/mainjob]
    [any apps.train flag, passed to every seed]
python -m benchmarks.mainjob --try NAME --validation-split 10000 [any apps.train flag]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess

# The backend scripts/main.sh trains on unless KERAS_BACKEND says otherwise: the arguments a
# run records (apps.train's defaults) are read under the same one.
os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402

from apps import train  # noqa: E402
from benchmarks import revision, write_json  # noqa: E402
from benchmarks.machine import describe_host  # noqa: E402

RUN_FILES = ("history.csv", "history.json", "labels.txt", "model.keras", "result.json")
SEEDS_COMMAND = "bash scripts/main.sh --seed N"  # seeds.json's command, its flags after it
REVISION_FILE = "revision.txt"  # in a run folder: the code revision the run was started from


def run_main_job(run_dir: str, flags: list[str], code: str | None) -> dict:
    """The result.json of the run that flags describe (their --run-dir is run_dir): an earlier
    run's where it finished with these arguments on this backend from this code revision,
    else a new run's. Any other finished run there (other arguments: apps.train.finished_result)
    is refused, so that no report mixes two runs or two versions of the code."""
    result = train.finished_result(flags)
    if result is None:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, REVISION_FILE), "w") as file:
            file.write(f"{code or ''}\n")
        subprocess.run(["bash", "scripts/main.sh", *flags], check=True)
        result = train.finished_result(flags)
    if result["backend"] != keras.backend.backend():
        raise FileExistsError(f"run folder {run_dir!r} holds a run finished on "
                              f"{result['backend']}, not on {keras.backend.backend()}: move it "
                              "or pass another --out")
    ran = started_revision(run_dir)
    if ran != code:
        raise FileExistsError(f"run folder {run_dir!r} holds a run finished from code "
                              f"{ran or 'of unknown revision'}, not from {code}: move it or "
                              "pass another --out")
    return result


def started_revision(run_dir: str) -> str | None:
    """The code revision a run folder's run was started from, None where it is not known (no
    file, or a run started outside a git checkout)."""
    path = os.path.join(run_dir, REVISION_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as file:
        return file.read().strip() or None


def run_seed(seed: int, run_dir: str, flags: list[str], code: str | None) -> dict:
    return run_main_job(run_dir, ["--seed", str(seed), "--run-dir", run_dir, *flags], code)


def epoch_seconds(run_dir: str) -> list[float]:
    """Each epoch's wall-clock seconds, as the run's history recorded them."""
    with open(os.path.join(run_dir, "history.json")) as file:
        history = json.load(file)
    return [history[epoch]["epoch_seconds"] for epoch in sorted(history, key=int)]


def record_try(name: str, run_dir: str, tries_dir: str, flags: list[str]) -> dict:
    """One run of the main job with `flags`, kept as tries_dir/NAME.json and
    NAME.history.json."""
    code = revision(".")
    result = run_main_job(run_dir, ["--run-dir", run_dir, *flags], code)
    report = {"command": " ".join(["bash scripts/main.sh", *flags]), "revision": code, **result,
              "epoch_seconds": epoch_seconds(run_dir), "machine": describe_host()}
    os.makedirs(tries_dir, exist_ok=True)
    shutil.copy(os.path.join(run_dir, "history.json"),
                os.path.join(tries_dir, f"{name}.history.json"))
    write_json(report, os.path.join(tries_dir, f"{name}.json"))
    return report


def seed_summary(result: dict, run_dir: str) -> dict:
    """A seed's accuracy and minutes, with the seconds its epochs took (the history's): what
    fit_seconds holds beyond them is model.fit's time outside its epochs; save_seconds is the
    model's save after fit, where the run records it."""
    kept = ("test_accuracy", "test_accuracy_single_view", "fit_seconds", "save_seconds",
            "evaluate_seconds", "total_seconds")
    return {**{k: result[k] for k in kept if k in result},
            "epochs_seconds": round(sum(epoch_seconds(run_dir)), 1)}


def summarise(results: dict[str, dict]) -> dict:
    """Mean, smallest and largest test accuracy and minutes over the seeds' results; with
    test-time flips, the single view's mean accuracy too."""
    accuracy = [r["test_accuracy"] for r in results.values()]
    fit_minutes = [r["fit_seconds"] / 60 for r in results.values()]
    total_minutes = [r["total_seconds"] / 60 for r in results.values()]
    single_view = [r.get("test_accuracy_single_view") for r in results.values()]
    single_view_mean = ({} if None in single_view else
                        {"mean_test_accuracy_single_view": round(statistics.mean(single_view), 4)})
    return {"mean_test_accuracy": round(statistics.mean(accuracy), 4), **single_view_mean,
            "min_test_accuracy": min(accuracy), "max_test_accuracy": max(accuracy),
            "mean_fit_minutes": round(statistics.mean(fit_minutes), 2),
            "max_fit_minutes": round(max(fit_minutes), 2),
            "mean_total_minutes": round(statistics.mean(total_minutes), 2)}


def main(argv=None) -> dict:
    # allow_abbrev=False: apps.train's --seed, meant for a try, is not taken for --seeds
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=os.path.join("runs", "mainjob"))
    parser.add_argument("--docs", help="where the results go: docs/mainjob for the seeds, "
                                         "notes/mainjob for a --try, unless given")
    parser.add_argument("--try", dest="try_name", metavar="NAME",
                        help="one run of the flags, recorded in DOCS/tries/NAME.json")
    args, flags = parser.parse_known_args(argv)
    if args.try_name:
        return record_try(args.try_name, os.path.join(args.out, "tries", args.try_name),
                          os.path.join(args.docs or os.path.join("notes", "mainjob"), "tries"),
                          flags)
    args.docs = args.docs or os.path.join("docs", "mainjob")
    if any(flag.startswith("--validation-split") for flag in flags):
        parser.error("--validation-split is for --try runs: the seeds' runs are the final "
                     "ones, scored once on the test split")
    run_dirs = {seed: os.path.join(args.out, f"seed{seed}") for seed in args.seeds}
    code = revision(".")  # the code the runs below start from
    results = {str(seed): run_seed(seed, run_dir, flags, code)
               for seed, run_dir in run_dirs.items()}
    report = {"command": " ".join([SEEDS_COMMAND, *flags]),
              "revision": code, "machine": describe_host(),
              "backend": results[str(args.seeds[0])]["backend"],
              "epochs": results[str(args.seeds[0])]["epochs"], **summarise(results),
              "seeds": {seed: seed_summary(r, run_dirs[int(seed)])
                        for seed, r in results.items()}}
    os.makedirs(args.docs, exist_ok=True)
    for name in RUN_FILES:
        shutil.copy(os.path.join(run_dirs[args.seeds[0]], name), os.path.join(args.docs, name))
    write_json(report, os.path.join(args.docs, "seeds.json"))
    return report


if __name__ == "__main__":
    main()
