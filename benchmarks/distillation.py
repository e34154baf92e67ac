"""DeiT's claims at small scale (issue 67): the main job's student (`vit-keras train`, its
model, recipe and epochs) on Fashion-MNIST without a teacher, and distilled soft, hard, and
hard through a distillation token, from a convnet teacher (`vit-keras train --convnet`, the
paper's ResNet as a classifier); and hard from a ViT teacher (the main job's model trained
longer) beside the convnet's.

Every run trains on the training images less the last --validation-split, is scored on those
(the choice among the students reads them only) and, once, on the test split; single views
(no test-time flip), as `vit-keras evaluate` scores a model. The teachers train the same way
(their own validation and test accuracy in the report) once, seed --teacher-seed, and each
teacher serves every student seed. Each run is `apps.train.main` with the flags a user would
give, then `apps.evaluate.main` on its model.keras.

A run folder under --out that holds a run finished with the same flags is read, not run again;
an interrupted one resumes (apps.train's run folders). The report is rewritten after every run,
so an interrupted benchmark keeps what it finished.

python -m benchmarks.distillation [--seeds 0 1 2] [--runs none soft/convnet hard/convnet
    hard-token/convnet hard/vit] [--validation-split 5000] [--out runs/distillation]
    [--json-dir docs/distillation] [--smoke]

Runs under the current KERAS_BACKEND (scripts/main.sh's torch for the main job's numbers).
"""

import argparse
import os
import statistics

import keras

from benchmarks import finished_or_trained, limit_flags, scored_on_test, write_json
from benchmarks.machine import describe_host

REPORT_FILE = "distillation.json"
# The teachers by name: the flags of `vit-keras train` beside the run's own (--seed, --run-dir,
# --validation-split). The convnet is --convnet's default ResNet; the ViT is the main job's
# model trained three times as long, to come near the convnet's accuracy (DeiT compares
# teachers of similar accuracy).
TEACHERS = {"convnet": ["--convnet"], "vit": ["--epochs", "24"]}
# --smoke's teachers: the smallest of each kind.
SMOKE_TEACHERS = {"convnet": ["--convnet", "--resnet-layers", "1"],
                  "vit": ["--hidden-size", "32", "--mlp-dim", "64", "--num-layers", "1"]}
# The students by name: the flags the main job gains. The distillation token needs the class
# token's head beside it (--classifier token).
STUDENTS = {"none": [], "soft": ["--distillation", "soft"], "hard": ["--distillation", "hard"],
            "hard-token": ["--distillation", "hard", "--distillation-token",
                           "--classifier", "token"]}
STUDENT_LABELS = {"none": "no teacher", "soft": "soft", "hard": "hard",
                  "hard-token": "hard, distillation token"}
# A run is a student and its teacher, "STUDENT/TEACHER" ("none" has no teacher), in the order
# they run: the main claims first, the teachers' comparison last.
RUNS = ("none", "hard/convnet", "hard-token/convnet", "soft/convnet", "hard/vit")
SMOKE_FLAGS = ["--epochs", "1", "--batch-size", "32", *limit_flags(64)]


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: --seed, apps.train's, is not taken for --seeds
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="the students' seeds")
    parser.add_argument("--teacher-seed", type=int, default=0)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    parser.add_argument("--validation-split", type=int, default=5000)
    parser.add_argument("--out", default=os.path.join("runs", "distillation"))
    parser.add_argument("--json-dir", default=None,
                        help="where distillation.json goes (docs/distillation for the page)")
    parser.add_argument("--smoke", action="store_true",
                        help="64 images, 1 epoch, the smallest teachers, one seed: checks "
                             "that the benchmark runs")
    return parser


def split(run: str) -> tuple[str, str | None]:
    """("hard", "convnet") of "hard/convnet"; ("none", None) of "none"."""
    student, _, teacher = run.partition("/")
    return student, teacher or None


def scored(run_dir: str, flags: list[str], smoke: bool) -> dict:
    """One run's facts: its minutes in model.fit, validation and test accuracy (single
    views), parameters."""
    result = finished_or_trained([*flags, "--run-dir", run_dir])
    test = scored_on_test(os.path.join(run_dir, "model.keras"), 64 if smoke else None)
    return {"fit_seconds": result["fit_seconds"],
            "validation_accuracy": result.get("validation_accuracy_single_view",
                                              result["validation_accuracy"]),
            "test_accuracy": test["top1"], "test_images": test["images"],
            "trainable_parameters": result["trainable_parameters"],
            "epochs": result["epochs"]}


def common_flags(args, seed: int) -> list[str]:
    return ["--seed", str(seed), "--validation-split", str(args.validation_split),
            *(SMOKE_FLAGS if args.smoke else [])]


def teacher_run(args, name: str) -> dict:
    """The teacher trained (or read) and scored, with its model's path."""
    model_flags = (SMOKE_TEACHERS if args.smoke else TEACHERS)[name]
    flags = [*model_flags, *common_flags(args, args.teacher_seed)]
    run_dir = os.path.join(args.out, "teachers", f"{name}-seed{args.teacher_seed}")
    facts = scored(run_dir, flags, args.smoke)
    print(f"teacher {name}: validation {facts['validation_accuracy']:.2%}, test "
          f"{facts['test_accuracy']:.2%}, {facts['fit_seconds'] / 60:.1f} min", flush=True)
    return {"teacher": name, "model_flags": " ".join(model_flags),
            "flags": " ".join(flags), **facts,
            "model": os.path.join(run_dir, "model.keras")}


def student_run(args, run: str, seed: int, teachers: dict) -> dict:
    """The student trained (or read) and scored; its teacher is trained first where it is
    not in `teachers` yet (and added there)."""
    student, teacher = split(run)
    flags = [*STUDENTS[student], *common_flags(args, seed)]
    if teacher is not None:
        if teacher not in teachers:
            teachers[teacher] = teacher_run(args, teacher)
        flags += ["--teacher", teachers[teacher]["model"]]
    run_dir = os.path.join(args.out, run.replace("/", "-"), f"seed{seed}")
    facts = scored(run_dir, flags, args.smoke)
    print(f"{run} seed {seed}: validation {facts['validation_accuracy']:.2%}, test "
          f"{facts['test_accuracy']:.2%}, {facts['fit_seconds'] / 60:.1f} min", flush=True)
    return {"run": run, "student": student, "teacher": teacher, "seed": seed,
            "flags": " ".join(flags), **facts}


def summary(rows: list[dict], teachers: dict) -> list[dict]:
    """Per run, over its seeds: the mean validation and test accuracy, the test accuracy's
    change from the students without a teacher (points), the mean model.fit minutes, and its
    teacher's accuracy and minutes; "chosen" marks the run of the best mean validation
    accuracy, the one choice the validation split makes."""
    runs = list(dict.fromkeys(row["run"] for row in rows))
    means = []
    for run in runs:
        own = [row for row in rows if row["run"] == run]
        student, teacher = split(run)
        means.append({
            "run": run, "student": student, "teacher": teacher,
            "label": STUDENT_LABELS[student], "seeds": [row["seed"] for row in own],
            **{key: statistics.mean(row[key] for row in own)
               for key in ("validation_accuracy", "test_accuracy", "fit_seconds")},
            "test_accuracies": [row["test_accuracy"] for row in own],
            "teacher_test_accuracy": teachers[teacher]["test_accuracy"] if teacher else None,
            "teacher_fit_seconds": teachers[teacher]["fit_seconds"] if teacher else None})
    base = next((row["test_accuracy"] for row in means if row["run"] == "none"), None)
    best = max(means, key=lambda row: row["validation_accuracy"])["run"]
    for row in means:
        row["test_change"] = (None if base is None else
                              round(100 * (row["test_accuracy"] - base), 2))
        row["chosen"] = row["run"] == best
    return means


def report_of(args, teachers: dict, rows: list[dict]) -> dict:
    return {"machine": describe_host(), "backend": keras.backend.backend(),
            "student": "the main job's model (vit-keras train)", "recipe": "fashion_mnist",
            "epochs": rows[0]["epochs"], "validation_split": args.validation_split,
            "test_images": rows[0]["test_images"], "seeds": args.seeds, "smoke": args.smoke,
            "teachers": list(teachers.values()), "runs": rows,
            "summary": summary(rows, teachers)}


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.seeds = args.seeds[:1]
    path = args.json_dir and os.path.join(args.json_dir, REPORT_FILE)
    teachers, rows = {}, []
    for seed in args.seeds:
        for run in args.runs:
            rows.append(student_run(args, run, seed, teachers))
            report = report_of(args, teachers, rows)
            write_json(report, path)
    if args.json_dir:
        from benchmarks import render

        print("\n\n".join(spec.render([report]) for spec in render.BLOCKS["distillation"]))
    return report


if __name__ == "__main__":
    main()
