"""Renders the generated blocks of README.md and docs/*.md, `<!-- NAME:begin -->` ...
`<!-- NAME:end -->`, from the code and from the measured results kept in docs/ (so every table
comes from a command), and rewrites them with --write. A block name without a renderer is an
error.

python -m benchmarks.render [--write]
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys

from apps.train import MAIN_JOB_EPOCHS
from apps.variants import pretrained_table, variant_table
from benchmarks import mainjob
from benchmarks.input_size import markdown as input_size_markdown
from benchmarks.machine import machine_line, machines_sentence, vector_extension
from benchmarks.tables import markdown, memory_markdown, overhead_markdown, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
BLOCK = re.compile(r"(<!-- ([\w-]+):begin -->\n)(.*?)(<!-- \2:end -->)", re.S)
BEGIN = re.compile(r"<!-- ([\w-]+):begin -->")


def _json(path):
    with open(os.path.join(DOCS, path)) as file:
        return json.load(file)


def _report_names(folder: str) -> list[str]:
    """The JSON reports' file names in docs/FOLDER, sorted."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(DOCS, folder, "*.json")))


def _reports(folder: str) -> list[dict]:
    return [_json(os.path.join(folder, name)) for name in _report_names(folder)]


def mainjob_line(folder: str = "mainjob") -> str:
    """The seeds' run of docs/FOLDER/seeds.json in a sentence."""
    report = _json(os.path.join(folder, "seeds.json"))
    single_view = report.get("mean_test_accuracy_single_view")
    how = ("" if single_view is None else
           f" (each image's logits averaged with its mirror's; {single_view:.2%} from the image "
           "alone)")
    return (f"**{report['mean_test_accuracy']:.2%} test accuracy**{how} on the 10,000 "
            f"Fashion-MNIST test images, the mean of seeds {', '.join(report['seeds'])} "
            f"({report['min_test_accuracy']:.2%} to {report['max_test_accuracy']:.2%}), after "
            f"{report['epochs']} epochs in {report['mean_fit_minutes']:.1f} minutes of "
            f"model.fit on average (at most {report['max_fit_minutes']:.1f}), on "
            f"{machine_line(report['machine'])}, {report['backend']} backend")


def mainjob_block() -> str:
    return (f"Measured with `python -m benchmarks.mainjob`, which runs `bash scripts/main.sh "
            f"--seed N` for each seed: {mainjob_line()}. Seed 0's run files are copied to "
            f"`docs/mainjob/`, the seeds' results to `docs/mainjob/seeds.json`.")


def readme_mainjob_block() -> str:
    return (f"Latest main job: {mainjob_line()} (the run's files are in `docs/mainjob/`; "
            f"seeds, recipe changes and shorter runs: [the main job](docs/mainjob.md)).")


def _seed_of(command: str) -> str:
    """The --seed of a main-job command line (apps.train's default, 0, where none is given)."""
    found = re.search(r"--seed (\d+)", command)
    return found.group(1) if found else "0"


def _tries(prefix: str) -> list[dict]:
    """The main job's tries whose names start with prefix (docs/mainjob/tries/), by name."""
    return [_json(os.path.join("mainjob", "tries", name))
            for name in _report_names(os.path.join("mainjob", "tries"))
            if name.startswith(prefix) and not name.endswith(".history.json")]


def mainjob_validation_block() -> str:
    """The tries that re-derive the default on a validation split (docs/mainjob/tries/val_*),
    and each setting's mean validation accuracy."""
    tries = _tries("val_")
    rows = [[str(t["epochs"]), _seed_of(t["command"]), f"{t['validation_accuracy']:.2%}",
             f"{t['fit_seconds'] / 60:.1f}",
             f"{min(t['epoch_seconds']):.0f}-{max(t['epoch_seconds']):.0f}",
             f"`{t['command']}`"] for t in tries]
    by_epochs = {}
    for t in tries:
        by_epochs.setdefault(t["epochs"], []).append(t["validation_accuracy"])
    means = "; ".join(f"{epochs} epochs: {statistics.mean(scores):.2%} (seeds: {len(scores)})"
                      for epochs, scores in sorted(by_epochs.items()))
    return (table(["epochs", "seed", "validation accuracy", "model.fit minutes",
                   "seconds per epoch", "command"], rows)
            + f"\n\nMean validation accuracy, {means}. {machines_sentence(tries)}")


def mainjob_tries_block(prefix: str) -> str:
    """The main job's tries named PREFIX* (docs/mainjob/tries/), one row each: fast_* behind
    the six-minute default, stretch_* behind the ten-minute recipe."""
    tries = _tries(prefix)
    rows = [[t["backend"], vector_extension(t["machine"]), str(t["epochs"]),
             f"{t['validation_accuracy']:.2%}", _percent(t.get("validation_accuracy_single_view")),
             f"{t['fit_seconds'] / 60:.1f}", f"{statistics.median(t['epoch_seconds']):.0f}",
             f"{t['fit_seconds'] - sum(t['epoch_seconds']):.0f}", f"`{t['command']}`"]
            for t in tries]
    return (table(["backend", "CPU", "epochs", "validation accuracy",
                   "validation accuracy, single view (runs with test-time flips)",
                   "model.fit minutes", "median seconds per epoch",
                   "model.fit seconds outside its epochs", "command"], rows)
            + f"\n\n{machines_sentence(tries)}")


def _single_view_mean(run: dict) -> float:
    """A seeds' run's mean single-view test accuracy: its only one where it scored single
    views (before test-time flips)."""
    return run.get("mean_test_accuracy_single_view", run["mean_test_accuracy"])


def _percent(fraction: float | None) -> str:
    """A fraction as a percentage, or "" where there is none."""
    return "" if fraction is None else f"{fraction:.2%}"


STRETCH_DOCS = os.path.join("mainjob", "stretch")  # the ten-minute recipe's seeds, under docs/


def mainjob_stretch_block() -> str:
    """The stretch recipe's seeds (docs/mainjob/stretch/seeds.json) and the command that ran
    them."""
    report = _json(os.path.join(STRETCH_DOCS, "seeds.json"))
    flags = report["command"].split(mainjob.SEEDS_COMMAND, 1)[1].strip()
    seed_model = _json(os.path.join(STRETCH_DOCS, "result.json"))["model"]  # OUT/seedN/model.keras
    out = os.path.dirname(os.path.dirname(seed_model))
    return (f"Measured with `python -m benchmarks.mainjob --out {out} --docs "
            f"docs/{STRETCH_DOCS} {flags}`: {mainjob_line(STRETCH_DOCS)}.")


def mainjob_step_options_block() -> str:
    """What each speed option does to a training step of the main job
    (docs/mainjob/steps/options.json, benchmarks.step_options)."""
    report = _json(os.path.join("mainjob", "steps", "options.json"))
    rows = [[row["option"], " ".join(row["flags"]) or "-", str(row["batch"]),
             f"{row['ms_per_step']:.1f}", f"{row['ms_per_image']:.3f}",
             f"{row['speed_vs_plain']:.2f}x"] for row in report["rows"]]
    return (table(["option", "flags", "batch", "ms per step", "ms per image",
                   "images per second against plain"], rows)
            + f"\n\n{machines_sentence([report])}")


def _seed_run_paths(folder: str) -> list[str]:
    """mainjob/seeds.json, the default's latest seeds, then each mainjob/FOLDER/NAME/seeds.json,
    relative to docs/."""
    return [os.path.join("mainjob", "seeds.json")] + [
        os.path.relpath(path, DOCS)
        for path in sorted(glob.glob(os.path.join(DOCS, "mainjob", folder, "*", "seeds.json")))]


def _seed_runs(folder: str) -> list[dict]:
    return [_json(path) for path in _seed_run_paths(folder)]


def _batches(steps: dict) -> tuple[str, str]:
    """A step_cost report's small and large batch, as its ms_per_step keys."""
    small, large = sorted(steps["ms_per_step"], key=int)
    return small, large


def _step_beside(path: str) -> str:
    """ms per step of 128 of the step measured beside a run of the seeds (benchmarks.step_cost
    in the same session), the machine's speed that day; "not measured" without the file."""
    if not os.path.exists(os.path.join(DOCS, path)):
        return "not measured"
    steps = _json(path)
    return f"{steps['ms_per_step'][_batches(steps)[1]]:.1f}"


def mainjob_cpus_block() -> str:
    """The default's seeds on each CPU they ran on: docs/mainjob/seeds.json, the latest (the
    step beside it: docs/mainjob/steps/torch.json), and the earlier ones'
    docs/mainjob/cpus/NAME/seeds.json (the step beside: NAME/step_cost.json)."""
    paths = _seed_run_paths("cpus")
    runs = [_json(path) for path in paths]
    steps = [os.path.join("mainjob", "steps", "torch.json")] + [
        os.path.join(os.path.dirname(path), "step_cost.json") for path in paths[1:]]
    rows = [[machine_line(run["machine"]), run.get("revision") or "not recorded",
             run["backend"], str(run["epochs"]), ", ".join(run["seeds"]),
             f"{run['mean_test_accuracy']:.2%}",
             f"{run['min_test_accuracy']:.2%} to {run['max_test_accuracy']:.2%}",
             f"{_single_view_mean(run):.2%}",
             f"{run['mean_fit_minutes']:.1f}", f"{run['max_fit_minutes']:.1f}",
             _step_beside(path)] for run, path in zip(runs, steps, strict=True)]
    return table(["machine", "code", "backend", "epochs", "seeds", "mean test accuracy",
                  "seeds' range", "mean test accuracy, single view",
                  "model.fit minutes, mean", "model.fit minutes, most",
                  "ms per step of 128 beside"], rows)


FASHION_MNIST_TRAIN = 60_000  # training images
# The default's latest seeds on the Intel Xeon, where the other backends' runs and the AVX2
# estimate (made before a run on the AVX2 CPU itself) were measured: its seeds.json and the
# step measured beside it (step_cost.json), under docs/mainjob/.
INTEL_RUN = os.path.join("cpus", "intel-xeon-amx-bc9e3ca")
AVX2_STAND_IN = {  # label: step_cost file under docs/mainjob/
    "the hybrid (the default)": os.path.join(INTEL_RUN, "step_cost.json"),
    "the hybrid, kernels capped at AVX2": "steps/avx2_capped/torch.json",
    "the plain 7x7-pixel ViT": "steps/avx2_capped/plain_7x7_torch_uncapped.json",
    "the plain 7x7-pixel ViT, kernels capped at AVX2": "steps/avx2_capped/plain_7x7_torch.json",
    "the plain 7x7-pixel ViT on the AVX2 CPU": "steps/plain_7x7/torch.json",
}


def avx2_estimate(hybrid: dict, plain: dict, real: dict, epochs: int,
                  steps_per_epoch: int) -> dict:
    """The hybrid's step on the AVX2 CPU from step_cost reports: its capped fixed cost and
    cost per image, each scaled by the plain ViT's real-to-capped ratio; at the reports' larger
    batch, and the minutes of `epochs` epochs of such steps."""
    fixed = hybrid["fixed_ms_per_step"] * real["fixed_ms_per_step"] / plain["fixed_ms_per_step"]
    per_image = hybrid["ms_per_image"] * real["ms_per_image"] / plain["ms_per_image"]
    batch = int(_batches(hybrid)[1])
    step = fixed + batch * per_image
    return {"fixed_ms": fixed, "ms_per_image": per_image, "batch": batch, "ms_per_step": step,
            "minutes": epochs * steps_per_epoch * step / 60_000}  # 60,000 ms a minute


def mainjob_avx2_block() -> str:
    """PyTorch's training step with its kernels capped at AVX2 beside the real AVX2 CPU's, and
    the hybrid's step there estimated from them (avx2_estimate)."""
    steps = {label: _json(os.path.join("mainjob", name))
             for label, name in AVX2_STAND_IN.items()}
    small, large = _batches(steps["the hybrid (the default)"])
    rows = [[label, machine_line(s["machine"]), f"{s['ms_per_step'][small]:.1f}",
             f"{s['ms_per_step'][large]:.1f}", f"{s['fixed_ms_per_step']:.1f}",
             f"{s['ms_per_image']:.3f}"] for label, s in steps.items()]
    estimate = avx2_estimate(steps["the hybrid, kernels capped at AVX2"],
                             steps["the plain 7x7-pixel ViT, kernels capped at AVX2"],
                             steps["the plain 7x7-pixel ViT on the AVX2 CPU"],
                             MAIN_JOB_EPOCHS, FASHION_MNIST_TRAIN // int(large))
    seeds, bracketed = seeds_ratio(steps["the hybrid (the default)"]), bracketed_ratio()
    low, high = (estimate["minutes"] * ratio for ratio in sorted([seeds, bracketed]))
    return (table(["model", "machine", f"ms per step of {small}", f"ms per step of {large}",
                   "fixed ms per step", "ms per image"], rows)
            + f"\n\nEstimate for the hybrid on the AVX2 CPU: {estimate['fixed_ms']:.1f} ms "
            f"fixed and {estimate['ms_per_image']:.3f} ms per image, "
            f"{estimate['ms_per_step']:.1f} ms per step of {estimate['batch']}, "
            f"{estimate['minutes']:.1f} minutes for {MAIN_JOB_EPOCHS} epochs of training steps "
            f"alone. On the first row's machine, model.fit took {seeds:.2f} times its steps at "
            f"the measured rate in the seeds' run and {bracketed:.2f} times in `{RATIO_TRY}`, a "
            f"validation run between two step measurements; at those ratios, {low:.1f} to "
            f"{high:.1f} minutes of model.fit on the AVX2 CPU.")


RATIO_TRY = "hybrid_e8_ratio"  # docs/mainjob/tries/, timed between steps/ratio/{before,after}


def seeds_ratio(steps: dict) -> float:
    """fit_to_steps_ratio of INTEL_RUN's seeds' mean model.fit, against the step cost of
    the report `steps`."""
    seeds = _json(os.path.join("mainjob", INTEL_RUN, "seeds.json"))
    run_steps = seeds["epochs"] * (FASHION_MNIST_TRAIN // int(_batches(steps)[1]))
    return fit_to_steps_ratio(seeds["mean_fit_minutes"] * 60, run_steps, [steps],
                              seeds["machine"])


def bracketed_ratio() -> float:
    """fit_to_steps_ratio of the validation run RATIO_TRY, against the mean of the step costs
    measured just before and just after it."""
    run = _json(os.path.join("mainjob", "tries", f"{RATIO_TRY}.json"))
    steps = [_json(os.path.join("mainjob", "steps", "ratio", f"{when}.json"))
             for when in ("before", "after")]
    trained = FASHION_MNIST_TRAIN - (run["data"]["validation_split"] or 0)
    run_steps = len(run["epoch_seconds"]) * (trained // int(_batches(steps[0])[1]))
    return fit_to_steps_ratio(run["fit_seconds"], run_steps, steps, run["machine"])


def fit_to_steps_ratio(fit_seconds: float, run_steps: int, steps: list[dict],
                       machine: dict) -> float:
    """model.fit's seconds over the seconds its run_steps take at the step_cost reports' mean
    rate (their larger batch): what model.fit adds to the steps (input pipeline, callbacks,
    the first epoch's warm-up, the machine's drift between the measurements). All from one
    machine."""
    for report in steps:
        if machine_line(report["machine"]) != machine_line(machine):
            raise ValueError(f"the run was on {machine_line(machine)}, the steps were timed "
                             f"on {machine_line(report['machine'])}: expected one machine")
    step_ms = statistics.mean(report["ms_per_step"][_batches(report)[1]] for report in steps)
    return fit_seconds / (run_steps * step_ms / 1000)


def _step_rounds(folder: str) -> dict[str, list[dict]]:
    """The step_cost reports of docs/FOLDER/before_N.json and after_N.json, by round."""
    return {tree: [_json(os.path.relpath(path, DOCS)) for path in sorted(
        glob.glob(os.path.join(DOCS, folder, f"{tree}_*.json")))] for tree in ("before", "after")}


def step_trees_block(folder: str, header: str = "tree",
                     labels: tuple[str, str] = ("before", "after")) -> str:
    """benchmarks.step_cost of two source trees in turns (docs/FOLDER/before_N.json and
    after_N.json, round N): each tree's medians over its rounds, and after against before.
    header and labels name what the two differ in, where that is not the tree."""
    trees = _step_rounds(folder)
    small, large = _batches(trees["after"][0])

    def median(reports, pick):
        return statistics.median(pick(report) for report in reports)

    rows = [[label, str(len(reports)),
             *(f"{median(reports, lambda r, b=b: r['ms_per_step'][b]):.1f}"
               for b in (small, large)),
             f"{median(reports, lambda r: r['fixed_ms_per_step']):.1f}",
             f"{median(reports, lambda r: r['ms_per_image']):.3f}"]
            for label, reports in zip(labels, trees.values(), strict=True)]
    ratios = [b["ms_per_step"][large] / a["ms_per_step"][large]
              for b, a in zip(trees["before"], trees["after"], strict=True)]
    return (table([header, "rounds", f"median ms per step of {small}",
                   f"median ms per step of {large}", "fixed ms per step", "ms per image"], rows)
            + f"\n\nA step of {large} images, {labels[0]} over {labels[1]}, round by round: "
            + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
            + f". {machines_sentence(trees['before'] + trees['after'])}")


def allocator_steps_block() -> str:
    """The main job's step with glibc's default allocator settings (before_N.json) and
    scripts/main.sh's (after_N.json), in turns, with the page faults a step takes under each."""
    folder = os.path.join("mainjob", "steps", "allocator")
    labels = ("glibc's defaults", "scripts/main.sh's")
    reports = _step_rounds(folder)
    large = _batches(reports["after"][0])[1]  # the batch step_cost counts the faults of
    faults = [statistics.median(r["page_faults_per_step"][large] for r in tree_reports)
              for tree_reports in reports.values()]
    return (step_trees_block(folder, "allocator settings", labels)
            + f"\n\nMinor page faults per step of {large} images, median: {faults[0]:.0f} "
            f"with {labels[0]}, {faults[1]:.0f} with {labels[1]}.")


def backends_table(folder: str, torch_steps: str) -> str:
    """The main job on each backend, all on one CPU, beside what a training step costs there:
    the default's seeds (docs/FOLDER/seeds.json, its step docs/TORCH_STEPS) and
    docs/FOLDER/backends/BACKEND/seeds.json (its step docs/FOLDER/steps/BACKEND.json)."""
    others = sorted(glob.glob(os.path.join(DOCS, folder, "backends", "*", "seeds.json")))
    runs = [_json(os.path.join(folder, "seeds.json"))] + [
        _json(os.path.relpath(path, DOCS)) for path in others]
    rows = []
    for run in runs:
        default = run is runs[0]
        steps = _json(torch_steps if default else
                      os.path.join(folder, "steps", f"{run['backend']}.json"))
        small, large = _batches(steps)
        prefix = "" if default else f"KERAS_BACKEND={run['backend']} "
        rows.append([run["backend"], f"{run['mean_test_accuracy']:.2%}",
                     f"{_single_view_mean(run):.2%}",
                     str(len(run["seeds"])), f"{run['mean_fit_minutes']:.1f}",
                     f"{steps['ms_per_step'][small]:.1f}", f"{steps['ms_per_step'][large]:.1f}",
                     f"{steps['fixed_ms_per_step']:.1f}", f"{steps['ms_per_image']:.3f}",
                     f"`{prefix}{run['command']}`"])
    return (table(["backend", "test accuracy", "single view", "seeds", "model.fit minutes",
                   f"ms per step of {small}", f"ms per step of {large}", "fixed ms per step",
                   "ms per image", "command"], rows) + f"\n\n{machines_sentence(runs)}")


def mainjob_backends_block() -> str:
    """The latest runs on each backend (docs/mainjob/)."""
    return backends_table("mainjob", os.path.join("mainjob", "steps", "torch.json"))


def mainjob_backends_intel_block() -> str:
    """The earlier runs on each backend on the Intel Xeon (docs/mainjob/INTEL_RUN/)."""
    folder = os.path.join("mainjob", INTEL_RUN)
    return backends_table(folder, os.path.join(folder, "step_cost.json"))


def setup_line() -> str:
    report = _json(os.path.join("mainjob", "setup.json"))
    return (f"`{report['command']}` on a fresh clone took {report['seconds']:.0f} s "
            f"({report['pip']}; {machine_line(report['machine'])}).")


def _export_table(report) -> str:
    return table(["format", "size", "max abs diff (probabilities)", "top-1 agreement",
                  "latency ms/image", "within tolerance"],
                 [[kind, f"{r['size_bytes'] / 1024:.0f} KiB",
                   f"{r['max_abs_diff_probabilities']:.2e}", f"{r['top1_agreement']:.2%}",
                   f"{r['latency_ms_per_image']:.3f}", "yes" if r["passed"] else "**no**"]
                  for kind, r in report["formats"].items()])

TI16_EXPORTS = {
    "32": "trained one epoch on Fashion-MNIST at 32 px and exported at that size",
    "224": ("the same model loaded at 224 px with its position embeddings resampled and not "
            "fine-tuned: the numbers are about the export, not the model's accuracy"),
}


def export_block() -> str:
    report = _json("export/export_report.json")
    images = next(iter(report["formats"].values()))["images"]
    text = (f"The main job's model when it had 4x4-pixel patches ({report['model']}, input "
            f"{report['input_shape']}; `docs/models/fashion_mnist_p4.keras`), from "
            f"`vit-keras export runs/fashion_mnist/model.keras --samples {images} "
            f"--calibration 200` on {images} held-out test images "
            f"(`docs/export/export_report.json`):\n\n" + _export_table(report))
    for size, how in TI16_EXPORTS.items():
        name = f"export/ti16_{size}_export_report.json"
        if not os.path.exists(os.path.join(DOCS, name)):
            continue
        ti16 = _json(name)
        images = next(iter(ti16["formats"].values()))["images"]
        failed = [kind for kind, r in ti16["formats"].items() if not r["passed"]]
        verdict = (f"{', '.join(failed)} misses its bar, so that export fails loudly"
                   if failed else "every file is within its tolerance")
        text += (f"\n\nViT-Ti/16 at {size} px ({ti16['model']}), {how}; made by "
                 f"`bash scripts/ti16_export.sh`, on {images} test images (`docs/{name}`): "
                 f"{verdict}.\n\n" + _export_table(ti16))
    return text


def parity_block() -> str:
    results = _json("weights/parity.json")["backends"]
    first = next(iter(results.values()))
    rows = [[f"`{name}`", f"`{result['architecture']}`",
             *(f"{results[b][name]['max_abs_diff']:.1e}" for b in results)]
            for name, result in first.items()]
    return ("The largest |vit_keras - timm| on two random images, from "
            "`python -m benchmarks.parity --json docs/weights/parity.json`:\n\n"
            + table(["name", "timm architecture (shrunk to width 32, depth 2)", *results], rows))

def revisions_block(folder: str = "revisions") -> str:
    reports = _reports(os.path.join("bench", folder))
    rows = [[s["backend"], f"{s['variant']}, {s['batch']}", kind,
             f"{s[kind]['before_images_s']:.1f}", f"{s[kind]['after_images_s']:.1f}",
             f"{s[kind]['ratio']:.3f}", f"{s[kind]['spread']:.1%}"]
            for report in reports for s in report["summary"]
            for kind in ("infer", "train") if kind in s]
    pairs = sorted({(r["revisions"]["before"], r["revisions"]["after"]) for r in reports})
    compared = "; ".join(f"before {before}, after {after}" for before, after in pairs)
    machines = "; ".join(sorted({machine_line(r["machine"]) for r in reports}))
    return (table(["backend", "variant, batch", "kind", "before img/s", "after img/s",
                   "after/before", "spread"], rows)
            + f"\n\nRevisions compared: {compared}. Machine: {machines}.")

def masked_patch_block() -> str:
    report = _json("paper/masked_patch.json")
    pre, tuned, scratch = (report[k] for k in ("pretrain", "pretrain_then_finetune", "scratch"))
    minutes = [(pre["fit_seconds"] + tuned["fit_seconds"]) / 60, scratch["fit_seconds"] / 60]
    runs = table(["run", "epochs", "minutes in model.fit", "test accuracy"], [
        ["masked patch pre-training, then fine-tuning", f"{pre['epochs']} + {tuned['epochs']}",
         f"{minutes[0]:.1f}", f"{tuned['test_accuracy']:.2%}"],
        ["from scratch", str(scratch["epochs"]), f"{minutes[1]:.1f}",
         f"{scratch['test_accuracy']:.2%}"]])
    probes = report["probes"]
    shots = list(next(iter(probes.values()))["few_shot"])
    probe_rows = [[name.replace("_", " "), *(f"{p['few_shot'][k]:.2%}" for k in shots),
                   f"{p['linear_probe']:.2%}"] for name, p in probes.items()]
    count = next(iter(probes.values()))["probe_train_images"]
    colour = "intensity" if pre["color_channels"] == 1 else "colour"
    return (f"{machine_line(report['machine'])}, {report['backend']} backend. The corrupted "
            f"patches' mean {colour} was predicted with {pre['accuracy']:.1%} accuracy at "
            f"the end of pre-training.\n\n" + runs
            + f"\n\nThe frozen representation (the pooled tokens), probed on the 10,000 test "
            f"images: few-shot accuracy by training examples per class, and a linear probe on "
            f"{count:,} training images:\n\n"
            + table(["backbone", *(f"{k}-shot" for k in shots), "linear probe"], probe_rows))


def resolution_block() -> str:
    report = _json("paper/resolution.json")
    rows = [[size, str(run["epochs"]), f"{run['fit_seconds'] / 60:.1f}",
             f"{run['test_accuracy']:.2%}"] for size, run in report["runs"].items()]
    return (f"{machine_line(report['machine'])}, {report['backend']} backend; recipe "
            f"`{report['recipe']}` at peak learning rate {report['learning_rate']}, from "
            f"`{report['model']}`:\n\n"
            + table(["fine-tuned at", "epochs", "minutes in model.fit", "test accuracy"], rows))


def posemb_block() -> str:
    report = _json("paper/posemb.json")
    paper = report["paper_five_shot"]
    rows = [[f"`{kind}`", f"{statistics.mean([r['test_accuracy'] for r in runs]):.2%}",
             " / ".join(f"{r['test_accuracy']:.2%}" for r in runs),
             f"{statistics.mean([r['five_shot'] for r in runs]):.2%}",
             f"{paper[kind]:.2%}" if kind in paper else "(not in Table 8)"]
            for kind, runs in report["runs"].items()]
    seeds = ", ".join(str(r["seed"]) for r in next(iter(report["runs"].values())))
    minutes = sum(r["fit_seconds"] for runs in report["runs"].values() for r in runs) / 60
    return (f"{machine_line(report['machine'])}, {report['backend']} backend; {report['epochs']} "
            f"epochs per run, seeds {seeds}, {minutes:.0f} minutes of model.fit in all:\n\n"
            + table(["position embedding", "test accuracy (mean)", "per seed",
                     "5-shot linear (mean)", "paper: ViT-B/16, ImageNet 5-shot"], rows))


def pooling_block() -> str:
    report = _json("paper/pooling.json")
    chosen = report["chosen_on_validation"]
    rows = [[classifier, f"{r['learning_rate']:g}", f"{r['validation_accuracy']:.2%}",
             f"{chosen[classifier]['test_accuracy']:.2%}"
             if r["learning_rate"] == chosen[classifier]["learning_rate"] else ""]
            for classifier, runs in report["runs"].items() for r in runs]
    return (f"{machine_line(report['machine'])}, {report['backend']} backend; "
            f"{report['epochs']} epochs per run on the first "
            f"{60_000 - report['validation_split']:,} training images, validation on the "
            f"last {report['validation_split']:,}; each classifier's best rate on validation "
            f"scored once on the 10,000 test images:\n\n"
            + table(["classifier", "peak learning rate", "validation accuracy",
                     "test accuracy (best rate only)"], rows))


def shape_block() -> str:
    report = _json("paper/shape.json")
    rows = [[name, str(r["shape"]["num_layers"]), str(r["shape"]["hidden_size"]),
             f"{r['shape']['patch_size']}x{r['shape']['patch_size']}",
             str(r["tokens"]), f"{r['trainable_parameters']:,}",
             f"{r['forward_mflop_per_image']:.1f}", str(r["epochs"]),
             f"{r['training_cost']:.2f}x", f"{r['test_accuracy']:.2%}",
             f"{r['fit_seconds'] / 60:.1f}"]
            for name, r in report["runs"].items()]
    return (f"{machine_line(report['machine'])}, {report['backend']} backend:\n\n"
            + table(["run", "blocks", "width", "patch", "tokens", "parameters",
                     "forward MFLOP per image", "epochs", "training compute", "test accuracy",
                     "minutes in model.fit"], rows))


def input_size_block() -> str:
    return input_size_markdown(_json("paper/input_size.json"))


def finetune_memory_block() -> str:
    rows = [[r["backend"], f"{r['variant']}, {r['batch']}", r["setting"],
             f"{r['trainable_parameters']:,}", f"{r['model_mib']:,}", f"{r['peak_mib']:,}",
             f"{r['peak_mib'] - r['model_mib']:,}"]
            for report in _reports("finetune") for r in report]
    return table(["backend", "variant, batch", "setting", "trainable parameters", "model MiB",
                  "peak MiB", "added by training MiB"], rows)


def finetune_lora_block() -> str:
    """The 4x4-pixel main job's model (docs/models/fashion_mnist_p4.keras, its result.json
    beside it), then fine-tuned in full and with LoRA (apps.finetune's result.json of each
    run, kept in docs/finetune/lora/)."""
    before = _json("models/fashion_mnist_p4.result.json")
    rows = [["before (`fashion_mnist_p4.keras`)", "", f"{before['test_accuracy']:.2%}",
             f"{before['test_top5']:.2%}"]]
    for name, training in (("full", "full fine-tune"),
                           ("rank8", "LoRA rank 8 on query and value")):
        run = _json(f"finetune/lora/{name}.json")
        rows.append([training, f"{run['trainable_parameters']:,}",
                     f"{run['test_accuracy']:.2%}", f"{run['test_top5']:.2%}"])
    return table(["training", "trainable parameters", "test top-1", "test top-5"], rows)


def finetune_quantization_block() -> str:
    """apps.evaluate's evaluation.json for each weight format, in
    docs/finetune/quantization/FORMAT/."""
    rows = [[weights, f"{report['top1']:.2%}", f"{report['top5']:.2%}"]
            for weights in ("float32", "int8", "float8", "int4")
            for report in [_json(f"finetune/quantization/{weights}/evaluation.json")]]
    return table(["weights", "top-1", "top-5"], rows)


def bench_block(folder: str = "bench") -> str:
    return markdown(_reports(folder))


def bench_scaling_block() -> str:
    reports = _reports(os.path.join("bench", "scaling"))
    return markdown(reports, footer=False) + "\n\n" + machines_sentence(reports)


def bench_memory_block() -> str:
    reports = _reports(os.path.join("bench", "memory"))
    return memory_markdown(reports) + "\n\n" + machines_sentence(reports)


def bench_overhead_block(folder: str = os.path.join("bench", "overhead")) -> str:
    reports = _reports(folder)
    return (overhead_markdown(reports, _report_names(folder))
            + f"\n\n{machines_sentence(reports)}")


BLOCKS = {"variants": variant_table, "pretrained": pretrained_table, "mainjob": mainjob_block,
          "readmemainjob": readme_mainjob_block, "mainjobvalidation": mainjob_validation_block,
          "mainjobfast": lambda: mainjob_tries_block("fast_"),
          "mainjobstretchtries": lambda: mainjob_tries_block("stretch_"),
          "mainjobstretch": mainjob_stretch_block,
          "mainjobbackends": mainjob_backends_block,
          "mainjobbackendsintel": mainjob_backends_intel_block, "mainjobcpus": mainjob_cpus_block,
          "mainjobavx2": mainjob_avx2_block, "mainjobsetup": setup_line,
          "mainjobstepoptions": mainjob_step_options_block,
          "parity": parity_block, "finetunememory": finetune_memory_block,
          "finetunelora": finetune_lora_block,
          "finetunequantization": finetune_quantization_block,
          "revisions": revisions_block,
          "dynamicsize": lambda: revisions_block("revisions-dynamic"),
          "mainjobresnetkernels": lambda: revisions_block("revisions-resnet-kernels"),
          "mainjobconv": lambda: revisions_block("revisions-conv"),
          "mainjobdirect": lambda: revisions_block("revisions-direct"),
          "mainjobdirectsteps": lambda: step_trees_block(os.path.join("mainjob", "steps",
                                                                      "direct")),
          "mainjobfusedsteps": lambda: step_trees_block(os.path.join("mainjob", "steps",
                                                                     "fused")),
          "mainjoballocatorsteps": allocator_steps_block,
          "mainjobgroupnormsteps": lambda: step_trees_block(os.path.join("mainjob", "steps",
                                                                         "group_norm")),
          "maskedpatch": masked_patch_block, "resolution": resolution_block,
          "posemb": posemb_block, "pooling": pooling_block, "shape": shape_block,
          "inputsize": input_size_block,
          "export": export_block, "bench": bench_block,
          "benchscaling": bench_scaling_block, "benchmemory": bench_memory_block,
          "benchxlawidth": lambda: bench_block(os.path.join("bench", "xla-width")),
          "benchavx2": lambda: bench_block(os.path.join("bench", "avx2")),
          "benchoverhead": bench_overhead_block,
          "benchoverheadbefore": lambda: bench_overhead_block(
              os.path.join("bench", "overhead", "before"))}


def render(text: str, where: str = "the text") -> str:
    """text with every generated block rendered anew; a block whose name has no renderer, or
    whose begin marker has no end, raises ValueError."""
    names = BEGIN.findall(text)
    unknown = sorted(set(names) - set(BLOCKS))
    if unknown:
        raise ValueError(f"{where} has generated blocks {unknown} that no renderer makes; "
                         f"known: {sorted(BLOCKS)}")
    closed = [match.group(2) for match in BLOCK.finditer(text)]
    if closed != names:
        raise ValueError(f"{where}: blocks {sorted(set(names) - set(closed))} have a begin "
                         f"marker without its end marker")
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group(2)]() + "\n" + m.group(4), text)


def doc_pages() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(DOCS, "*.md")))]


def main(argv=None) -> list[str]:
    """Renders every page; returns the pages whose blocks were stale (rewritten with --write)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the stale pages in place")
    args = parser.parse_args(argv)
    stale = []
    for path in doc_pages():
        with open(path) as file:
            current = file.read()
        rendered = render(current, os.path.relpath(path, ROOT))
        if rendered == current:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if args.write:
            with open(path, "w") as file:
                file.write(rendered)
    verdict = "rewritten" if args.write else "stale: run with --write"
    print(f"{', '.join(stale)} {verdict}" if stale else "README.md and docs/*.md are up to date")
    return stale


if __name__ == "__main__":
    sys.exit(1 if main() and "--write" not in sys.argv else 0)
