"""Renders the generated blocks of README.md and docs/*.md, `<!-- NAME:begin -->` ...
`<!-- NAME:end -->`, from measured results committed as JSON, and rewrites them with --write.

A block is one or more column specs (Spec): which JSON files it reads, how their reports
become rows, and each column's header and format. One renderer turns a spec into a Markdown
table, or into one line of "header: value" items. The words around a table live in its page,
so that a figure's prose is written once, where it is read. A block name without a spec is an
error; a block that is on no page is not rendered.

python -m benchmarks.render [--write]
"""

import argparse
import dataclasses
import glob
import json
import os
import re
import statistics
import string
import sys
from collections.abc import Callable

from apps.variants import pretrained_table
from benchmarks.machine import machine_line
from benchmarks.tables import utilisation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A marker is a line of its own, so that a page may name one in its text.
BLOCK = re.compile(r"^(<!-- ([\w-]+):begin -->\n)(.*?)^(<!-- \2:end -->)$", re.S | re.M)
BEGIN = re.compile(r"^<!-- ([\w-]+):begin -->$", re.M)


class CellFormat(string.Formatter):
    """str.format for cells: a field is a dotted path into nested dicts (`ms_per_step.128`,
    keys kept as text, as JSON has them); None reads "not run"; text (a cell its row made)
    is written as it is, whatever the format; a bool is lower case, as the command line
    writes it; the format "rate" gives two decimals below 10 (B/16 at 384 px runs under one
    image a second) and one above."""

    def get_field(self, field_name, args, kwargs):
        value = kwargs
        for key in field_name.split("."):
            value = value[key]
        return value, field_name

    def format_field(self, value, format_spec):
        if value is None:
            return "not run"
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return str(value).lower()
        if format_spec == "rate":
            format_spec = ".2f" if value < 10 else ".1f"
        return format(value, format_spec)


CELL = CellFormat()


@dataclasses.dataclass(frozen=True)
class Spec:
    """A table of committed reports. files: globs under the repository root, their matches
    read in order, each glob's sorted (a dict report gains "file", its name); rows: the
    reports to the table's rows (default: each report is a row); columns: (header, template)
    pairs, the template a str.format string over a row (CellFormat), a report's machine
    written by machine_line. line: one row as "header: value" items, a header left empty
    showing the value alone, instead of a table."""

    files: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    rows: Callable[[list], list[dict]] = list
    line: bool = False

    def render(self, reports: list | None = None) -> str:
        """The spec's table (or line) of `reports`, read from its files where none are given."""
        if reports is None:
            reports = [read(path) for pattern in self.files
                       for path in sorted(glob.glob(os.path.join(ROOT, pattern)))]
            if not reports:
                raise FileNotFoundError(f"no report matches {', '.join(self.files)} under "
                                        f"{ROOT}: expected the JSON the table renders")
        cells = [[CELL.vformat(template, (), printable(row)) for _, template in self.columns]
                 for row in self.rows(reports)]
        headers = [header for header, _ in self.columns]
        if self.line:
            return "; ".join(f"{header}: {cell}" if header else cell
                             for header, cell in zip(headers, cells[0], strict=True)) + "."
        return table(headers, cells)


def read(path: str):
    with open(path) as file:
        report = json.load(file)
    if isinstance(report, dict):
        report["file"] = os.path.basename(path)
    return report


def printable(row: dict) -> dict:
    machine = row.get("machine")
    return {**row, "machine": machine_line(machine)} if isinstance(machine, dict) else row


def table(header: list[str], rows: list[list]) -> str:
    """A Markdown table: the header, its separator, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def machines(reports: list[dict]) -> list[dict]:
    """One row naming the machine (or machines) the reports ran on."""
    return [{"machine": "; ".join(sorted({machine_line(r["machine"]) for r in reports}))}]


def machine_of(*files: str, **extra: str) -> Spec:
    """A line naming the reports' machine, then `extra` items (header: template) of the
    first report."""
    def rows(reports):
        return [{**reports[0], **machines(reports)[0]}]

    return Spec(files, (("Machine", "{machine}"), *extra.items()), rows, line=True)


def each(key: str) -> Callable[[list], list[dict]]:
    """Rows from each report's list or dict `key` (a dict's keys as "key"), beside the report's
    own fields."""
    def rows(reports):
        return [{**report, "key": name, **row} for report in reports
                for name, row in (report[key].items() if isinstance(report[key], dict)
                                  else enumerate(report[key]))]
    return rows


def bench_rows(reports: list[dict]) -> list[dict]:
    return [{**report, **row, "utilisation": utilisation(report, row)}
            for report in reports for row in report["results"]]


BENCH_COLUMNS = (
    ("backend", "{backend}"), ("variant", "{variant}"), ("px", "{image_size}"),
    ("batch", "{batch}"), ("precision", "{precision}"), ("implementation", "{implementation}"),
    ("jit_compile", "{jit_compile}"), ("infer img/s", "{infer_images_s:rate}"),
    ("latency ms (b1)", "{latency_ms:.1f}"), ("train img/s", "{train_images_s:rate}"),
    ("GFLOP/img", "{gflops_per_image:.2f}"), ("% of matmul peak", "{utilisation:.0%}"))
BENCH = Spec(("docs/bench/*.json",), BENCH_COLUMNS, bench_rows)


def overhead_rows(reports: list[dict]) -> list[dict]:
    """Milliseconds per forward pass and training step, and their ratio to the same run's
    timm: eager rows against timm eager, compiled ones against timm under torch.compile."""
    rows = []
    for report in reports:
        ms = {r["implementation"]: (1000 * r["batch"] / r["infer_images_s"],
                                    1000 * r["batch"] / r["train_images_s"])
              for r in report["results"]}
        for row in report["results"]:
            compiled = row["jit_compile"] is True and "timm-compile" in ms
            peer = "timm-compile" if compiled else "timm"
            (forward, train), (peer_forward, peer_train) = ms[row["implementation"]], ms[peer]
            rows.append({**report, **row, "peer": peer, "forward_ms": forward,
                         "forward_ratio": forward / peer_forward, "train_ms": train,
                         "train_ratio": train / peer_train})
    return rows


def memory_rows(reports: list[dict]) -> list[dict]:
    return [{**row, "weights_mib": row["params"] * 4 / 2**20} for row in each("memory")(reports)]


MEMORY = Spec(("docs/bench/memory/*.json",), (
    *BENCH_COLUMNS[:7], ("weights MiB", "{weights_mib:,.0f}"),
    ("inference peak MiB", "{infer_peak_mib:,.0f}"), ("training peak MiB", "{train_peak_mib:,.0f}"),
    ("second training step MiB", "{train_again_peak_mib:,.0f}")), memory_rows)


def seed_runs(reports: list[dict]) -> list[dict]:
    """Seeds' reports (benchmarks.mainjob) with their seeds listed and counted, and the single
    view's mean accuracy (a run before test-time flips scored single views only)."""
    return [{**run, "seed_list": ", ".join(run["seeds"]), "seed_count": len(run["seeds"]),
             "single_view": run.get("mean_test_accuracy_single_view", run["mean_test_accuracy"])}
            for run in reports]


def backend_rows(reports: list[dict]) -> list[dict]:
    """Each backend's seeds beside what a training step costs there (benchmarks.step_cost in
    docs/mainjob/steps/BACKEND.json); the first report is the run scripts/main.sh makes, the
    others name their backend in the command."""
    rows = []
    for index, run in enumerate(seed_runs(reports)):
        steps = read(os.path.join(ROOT, "docs", "mainjob", "steps", f"{run['backend']}.json"))
        prefix = f"KERAS_BACKEND={run['backend']} " if index else ""
        rows.append({**run, **steps, "command": prefix + run["command"]})
    return rows


def export_rows(reports: list[dict]) -> list[dict]:
    return [{**row, "model": f"{report['model']}, {report['input_shape'][0]} px",
             "size_kib": row["size_bytes"] / 1024, "within": "yes" if row["passed"] else "**no**"}
            for report in reports for row in each("formats")([report])]


def parity_rows(reports: list[dict]) -> list[dict]:
    backends = reports[0]["backends"]
    return [{"name": name, "architecture": result["architecture"],
             **{b: backends[b][name]["max_abs_diff"] for b in backends}}
            for name, result in next(iter(backends.values())).items()]


def masked_patch_runs(reports: list[dict]) -> list[dict]:
    pre, tuned, scratch = (reports[0][k] for k in ("pretrain", "pretrain_then_finetune",
                                                   "scratch"))
    return [{"run": "masked patch pre-training, then fine-tuning",
             "epochs": f"{pre['epochs']} + {tuned['epochs']}",
             "minutes": (pre["fit_seconds"] + tuned["fit_seconds"]) / 60,
             "test_accuracy": tuned["test_accuracy"]},
            {"run": "from scratch", "epochs": str(scratch["epochs"]),
             "minutes": scratch["fit_seconds"] / 60, "test_accuracy": scratch["test_accuracy"]}]


def posemb_rows(reports: list[dict]) -> list[dict]:
    report = reports[0]
    return [{"kind": kind, "per_seed": " / ".join(f"{r['test_accuracy']:.2%}" for r in runs),
             "accuracy": statistics.mean(r["test_accuracy"] for r in runs),
             "five_shot": statistics.mean(r["five_shot"] for r in runs),
             "paper": report["paper_five_shot"].get(kind, "(not in Table 8)")}
            for kind, runs in report["runs"].items()]


def posemb_summary(reports: list[dict]) -> list[dict]:
    report = reports[0]
    runs = [run for runs in report["runs"].values() for run in runs]
    return [{**report, "seeds": ", ".join(sorted({str(r["seed"]) for r in runs})),
             "minutes": sum(r["fit_seconds"] for r in runs) / 60}]


def pooling_rows(reports: list[dict]) -> list[dict]:
    chosen = reports[0]["chosen_on_validation"]
    return [{**run, "classifier": classifier,
             "test": chosen[classifier]["test_accuracy"]
             if run["learning_rate"] == chosen[classifier]["learning_rate"] else ""}
            for classifier, runs in reports[0]["runs"].items() for run in runs]


def input_size_rows(reports: list[dict]) -> list[dict]:
    report = reports[0]
    return [{**row, "peaks": ", ".join(f"{p['peak_mib']:,.1f} ({p['batch']})"
                                       for p in row["peaks"]),
             "budget": row["available_mib"] * (1 - report["safety_margin"]),
             "largest": "no fit" if row["largest_batch_projected"] is None
             else f"{row['largest_batch_projected']:,}"} for row in report["rows"]]


def times(value: float | None) -> str:
    """A ratio as "1.52x"; "not run" where it was not measured."""
    return "not run" if value is None else f"{value:.2f}x"


def litert_cells(row: dict, engine: str) -> dict:
    """A token_budget speed row's LiteRT milliseconds and speed-up for engine ("float32",
    "int8") as text: "fails" where LiteRT could not run the file (speed.json says why)."""
    key = f"litert_{engine}"
    if row.get(f"{key}_error"):
        return {f"{key}_ms": "fails", f"{key}_speedup": "fails"}
    ms = row.get(f"{key}_ms")
    return {f"{key}_ms": "not run" if ms is None else f"{ms:.2f}",
            f"{key}_speedup": times(row.get(f"{key}_speedup"))}


def token_speed_rows(reports: list[dict]) -> list[dict]:
    """benchmarks.token_budget's speed rows (reports: [accuracy, speed]) with their ratios as
    text and the tokens each block outputs as a list."""
    return [{**row, "amount_text": "0 / 1.0" if row["amount"] is None else row["amount"],
             "tokens": ", ".join(map(str, row["tokens_per_block"])),
             **{name: times(row[name]) for name in ("flop_ratio", "speedup", "latency_speedup")},
             **litert_cells(row, "float32"), **litert_cells(row, "int8"),
             "int8_top1_agreement": row.get("int8_top1_agreement"),
             "int8_vs_keras": "fails" if row.get("litert_int8_error") else "not run"
             if row["int8_over_keras"] is None else f"{row['int8_over_keras'] - 1:+.0%}"}
            for row in reports[1]["rows"]]


def token_tradeoff_rows(reports: list[dict]) -> list[dict]:
    """Each accuracy row of benchmarks.token_budget beside the speed of its model (the
    Fashion-MNIST rows of the speed report, timed with the fine-tuned weights; an off-the-shelf
    pruning row has the shapes, so the speed, of the fine-tuned one, but not its weights, so
    no int8 agreement of its own), and its accuracy change from the unreduced model's in
    points."""
    accuracy = reports[0]
    speed = {row["label"]: row for row in token_speed_rows(reports)
             if row["model"].startswith("fashion_mnist")}
    base = next(row for row in accuracy["rows"] if row["method"] == "none")
    return [{**speed[row["label"]], **row,
             **({"int8_top1_agreement": ""} if row["method"] == "EViT"
                and row["training"] == "off the shelf" else {}),
             **{f"{split}_change": 100 * (row[f"{split}_accuracy"] - base[f"{split}_accuracy"])
                for split in ("validation", "test")}} for row in accuracy["rows"]]


def distillation_rows(reports: list[dict]) -> list[dict]:
    """benchmarks.distillation's runs, each over its seeds, with its seeds' test accuracies,
    its teacher's test accuracy and minutes ("" for the run without one), and the run chosen
    on the validation split marked."""
    return [{**row, "teacher": row["teacher"] or "",
             "per_seed": ", ".join(f"{value:.2%}" for value in row["test_accuracies"]),
             "teacher_test": ("" if row["teacher"] is None
                              else f"{row['teacher_test_accuracy']:.2%}"),
             "teacher_minutes": ("" if row["teacher"] is None
                                 else f"{row['teacher_fit_seconds'] / 60:.1f}"),
             "chosen": "chosen" if row["chosen"] else ""} for row in reports[0]["summary"]]


def minutes(rows: Callable[[list], list[dict]]) -> Callable[[list], list[dict]]:
    """rows with each row's fit_seconds in minutes."""
    return lambda reports: [{**row, "minutes": row["fit_seconds"] / 60} for row in rows(reports)]


def backend_line(path: str, **extra: str) -> Spec:
    return machine_of(path, backend="{backend}", **extra)


REFERENCE = ("docs/mainjob/seeds.json",)  # the Fashion-MNIST reference run's seeds
PAPER = "docs/paper/{}.json"
TOKENS = ("docs/tokens/accuracy.json", "docs/tokens/speed.json")  # benchmarks.token_budget
DISTILLATION = ("docs/distillation/distillation.json",)  # benchmarks.distillation
BLOCKS = {
    "pretrained": pretrained_table,
    "readmemainjob": (Spec(REFERENCE, (
        ("Fashion-MNIST reference run (`bash scripts/main.sh`)",
         "{mean_test_accuracy:.2%} test accuracy, mean of seeds {seed_list}"),
        ("training", "{epochs} epochs, {mean_fit_minutes:.1f} minutes (model.fit)"),
        ("", "{machine}, {backend} backend")), seed_runs, line=True),),
    "seeds": (Spec(REFERENCE, (
        ("seed", "{key}"), ("test accuracy", "{test_accuracy:.2%}"),
        ("single view", "{test_accuracy_single_view:.2%}"),
        ("model.fit minutes", "{minutes:.1f}")), minutes(each("seeds"))),
        Spec(REFERENCE, (("Mean", "{mean_test_accuracy:.2%}"), ("single view", "{single_view:.2%}"),
                         ("epochs", "{epochs}"), ("backend", "{backend}"),
                         ("Machine", "{machine}")), seed_runs, line=True)),
    "backends": (Spec((*REFERENCE, "docs/mainjob/backends/*/seeds.json"), (
        ("backend", "{backend}"), ("test accuracy", "{mean_test_accuracy:.2%}"),
        ("single view", "{single_view:.2%}"), ("seeds", "{seed_count}"),
        ("model.fit minutes", "{mean_fit_minutes:.1f}"),
        ("ms per step of 8", "{ms_per_step.8:.1f}"),
        ("ms per step of 128", "{ms_per_step.128:.1f}"),
        ("fixed ms per step", "{fixed_ms_per_step:.1f}"), ("ms per image", "{ms_per_image:.3f}"),
        ("command", "`{command}`")), backend_rows), machine_of(*REFERENCE)),
    "setup": (Spec(("docs/mainjob/setup.json",), (
        ("", "`{command}` on a fresh clone: {seconds:.0f} s ({pip})"),
        ("Machine", "{machine}")), line=True),),
    "bench": (BENCH, machine_of("docs/bench/*.json")),
    "benchoverhead": (Spec(("docs/bench/overhead/*.json",), (
        ("backend", "{backend}"), ("implementation", "{implementation}"),
        ("jit_compile", "{jit_compile}"), ("forward ms", "{forward_ms:.1f}"),
        ("forward vs timm", "{forward_ratio:.2f}x {peer}"), ("train step ms", "{train_ms:.1f}"),
        ("train step vs timm", "{train_ratio:.2f}x {peer}"), ("report", "`{file}`")),
        overhead_rows), machine_of("docs/bench/overhead/*.json")),
    "benchmemory": (MEMORY, machine_of("docs/bench/memory/*.json")),
    "export": (Spec(("docs/export/export_report.json", "docs/export/ti16_32_export_report.json",
                     "docs/export/ti16_224_export_report.json"), (
        ("model", "{model}"), ("format", "{key}"), ("size", "{size_kib:.0f} KiB"),
        ("max abs diff (probabilities)", "{max_abs_diff_probabilities:.2e}"),
        ("top-1 agreement", "{top1_agreement:.2%}"),
        ("latency ms/image", "{latency_ms_per_image:.3f}"), ("test images", "{images}"),
        ("within tolerance", "{within}")), export_rows),),
    "parity": (Spec(("docs/weights/parity.json",), (
        ("name", "`{name}`"), ("timm architecture (shrunk to width 32, depth 2)",
                               "`{architecture}`"),
        *((backend, f"{{{backend}:.1e}}") for backend in ("tensorflow", "jax", "torch"))),
        parity_rows),),
    "finetunememory": (Spec(("docs/finetune/*.json",), (
        ("backend", "{backend}"), ("variant, batch", "{variant}, {batch}"),
        ("setting", "{setting}"),
        ("trainable parameters", "{trainable_parameters:,}"), ("model MiB", "{model_mib:,}"),
        ("peak MiB", "{peak_mib:,}"), ("added by training MiB", "{added:,}")),
        lambda reports: [{**row, "added": row["peak_mib"] - row["model_mib"]}
                         for report in reports for row in report]),),
    "finetunelora": (Spec(("docs/models/fashion_mnist_p4.result.json",
                           "docs/finetune/lora/full.json", "docs/finetune/lora/rank8.json"), (
        ("training", "{training}"), ("trainable parameters", "{trainable_parameters:,}"),
        ("test top-1", "{test_accuracy:.2%}"), ("test top-5", "{test_top5:.2%}")),
        lambda reports: [{"trainable_parameters": "", **report, "training": training}
                         for report, training in zip(reports, (
                             "before (`fashion_mnist_p4.keras`)", "full fine-tune",
                             "LoRA rank 8 on query and value"), strict=True)]),),
    "finetunequantization": (Spec(tuple(f"docs/finetune/quantization/{weights}/evaluation.json"
                                        for weights in ("float32", "int8", "float8", "int4")), (
        ("weights", "{weights}"), ("top-1", "{top1:.2%}"), ("top-5", "{top5:.2%}")),
        lambda reports: [{**r, "weights": r["quantization"] or "float32"} for r in reports]),),
    "maskedpatch": (
        backend_line(PAPER.format("masked_patch"),
                     **{"pre-training accuracy on the corrupted patches":
                        "{pretrain.accuracy:.1%}"}),
        Spec((PAPER.format("masked_patch"),), (
            ("run", "{run}"), ("epochs", "{epochs}"), ("minutes in model.fit", "{minutes:.1f}"),
            ("test accuracy", "{test_accuracy:.2%}")), masked_patch_runs),
        Spec((PAPER.format("masked_patch"),), (
            ("backbone", "{backbone}"),
            *((f"{shots}-shot", f"{{few_shot.{shots}:.2%}}") for shots in (1, 5, 10, 25)),
            ("linear probe", "{linear_probe:.2%}")),
            lambda reports: [{**probe, "backbone": name.replace("_", " ")}
                             for name, probe in reports[0]["probes"].items()])),
    "resolution": (
        backend_line(PAPER.format("resolution"), recipe="`{recipe}`",
                     **{"peak learning rate": "{learning_rate}", "from": "`{model}`"}),
        Spec((PAPER.format("resolution"),), (
            ("fine-tuned at", "{key}"), ("epochs", "{epochs}"),
            ("minutes in model.fit", "{minutes:.1f}"), ("test accuracy", "{test_accuracy:.2%}")),
            minutes(each("runs")))),
    "posemb": (
        Spec((PAPER.format("posemb"),), (
            ("Machine", "{machine}"), ("backend", "{backend}"), ("epochs per run", "{epochs}"),
            ("seeds", "{seeds}"), ("minutes of model.fit in all", "{minutes:.0f}")),
            posemb_summary, line=True),
        Spec((PAPER.format("posemb"),), (
            ("position embedding", "`{kind}`"), ("test accuracy (mean)", "{accuracy:.2%}"),
            ("per seed", "{per_seed}"), ("5-shot linear (mean)", "{five_shot:.2%}"),
            ("paper: ViT-B/16, ImageNet 5-shot", "{paper:.2%}")), posemb_rows)),
    "pooling": (
        backend_line(PAPER.format("pooling"), **{"epochs per run": "{epochs}",
                                                 "validation images": "{validation_split:,}"}),
        Spec((PAPER.format("pooling"),), (
            ("classifier", "{classifier}"), ("peak learning rate", "{learning_rate:g}"),
            ("validation accuracy", "{validation_accuracy:.2%}"),
            ("test accuracy (best rate only)", "{test:.2%}")), pooling_rows)),
    "shape": (
        backend_line(PAPER.format("shape")),
        Spec((PAPER.format("shape"),), (
            ("run", "{key}"), ("blocks", "{shape.num_layers}"), ("width", "{shape.hidden_size}"),
            ("patch", "{shape.patch_size}x{shape.patch_size}"), ("tokens", "{tokens}"),
            ("parameters", "{trainable_parameters:,}"),
            ("forward MFLOP per image", "{forward_mflop_per_image:.1f}"), ("epochs", "{epochs}"),
            ("training compute", "{training_cost:.2f}x"), ("test accuracy", "{test_accuracy:.2%}"),
            ("minutes in model.fit", "{minutes:.1f}")), minutes(each("runs")))),
    "token-budget": (
        Spec(TOKENS, (
            ("Accuracy", "{backend} backend, fine-tuned from `{model}` at {image_size} px "
                         "with a class token added"),
            ("recipe", "`{recipe}`, peak learning rate {learning_rate}, batch {batch_size}, "
                       "no patch dropout"), ("epochs", "{epochs}"),
            ("validation", "the last {validation_images:,} training images"),
            ("test", "{test_images:,} images"), ("Machine", "{machine}")),
            lambda reports: [reports[0]], line=True),
        Spec(TOKENS, (
            ("method", "{method}"), ("r or keep rate", "{amount_text}"),
            ("weights", "{training}"), ("tokens out of each block", "{tokens}"),
            ("FLOPs", "{flop_ratio}"), ("Keras img/s", "{infer_images_s:rate}"),
            ("throughput", "{speedup}"), ("LiteRT int8 (batch 1)", "{litert_int8_speedup}"),
            ("int8 vs Keras", "{int8_vs_keras}"),
            ("int8 top-1 agreement", "{int8_top1_agreement:.0%}"),
            ("validation", "{validation_accuracy:.2%}"),
            ("change (points)", "{validation_change:+.2f}"), ("test", "{test_accuracy:.2%}"),
            ("change (points)", "{test_change:+.2f}")),
            token_tradeoff_rows),
        Spec(TOKENS, (
            ("Speed", "{backend} backend (jit_compile {jit_compile}), the median of {repeats} "
                      "samples of at least {min_sample_s} s after {warmup} warm-up, every "
                      "model of a table in turns; LiteRT with {litert_threads} threads"),
            ("Machine", "{machine}")), lambda reports: [reports[1]], line=True),
        Spec(TOKENS, (
            ("model", "{model}"), ("method", "{method}"), ("r or keep rate", "{amount_text}"),
            ("tokens out of each block", "{tokens}"), ("GFLOP/image", "{gflops_per_image:#.3g}"),
            ("FLOPs", "{flop_ratio}"), ("batch", "{batch}"), ("img/s", "{infer_images_s:rate}"),
            ("throughput", "{speedup}"), ("latency ms (batch 1)", "{latency_ms:.1f}"),
            ("latency", "{latency_speedup}"), ("LiteRT float32 ms", "{litert_float32_ms}"),
            ("float32", "{litert_float32_speedup}"), ("LiteRT int8 ms", "{litert_int8_ms}"),
            ("int8", "{litert_int8_speedup}"),
            ("int8 top-1 agreement", "{int8_top1_agreement:.0%}"),
            ("peak MiB (first call)", "{infer_peak_mib:,.0f}")), token_speed_rows)),
    "distillation": (
        Spec(DISTILLATION, (
            ("Student", "{student}, recipe `{recipe}`, {epochs} epochs"),
            ("validation", "the last {validation_split:,} training images"),
            ("test", "{test_images:,} images, single views"), ("backend", "{backend}"),
            ("Machine", "{machine}")), line=True),
        Spec(DISTILLATION, (
            ("teacher", "{teacher}"), ("`vit-keras train` flags", "`{model_flags}`"),
            ("parameters", "{trainable_parameters:,}"), ("epochs", "{epochs}"),
            ("validation", "{validation_accuracy:.2%}"), ("test", "{test_accuracy:.2%}"),
            ("model.fit minutes", "{minutes:.1f}")), minutes(each("teachers"))),
        Spec(DISTILLATION, (
            ("student", "{label}"), ("teacher", "{teacher}"),
            ("validation (mean)", "{validation_accuracy:.2%}"),
            ("test (mean)", "{test_accuracy:.2%}"), ("test per seed", "{per_seed}"),
            ("vs no teacher (points)", "{test_change:+.2f}"),
            ("model.fit minutes (mean)", "{minutes:.1f}"), ("teacher's test", "{teacher_test}"),
            ("teacher's model.fit minutes", "{teacher_minutes}"),
            ("on validation", "{chosen}")), minutes(distillation_rows))),
    "inputsize": (
        backend_line(PAPER.format("input_size"), **{
            "inference batch": "{batch}", "calls timed (median)": "{repeats}",
            "memory budget": "MemAvailable less {safety_margin:.0%}",
            "the largest batch runs where it takes under": "{memory_seconds:.0f} s"}),
        Spec((PAPER.format("input_size"),), (
            ("variant", "{variant}"), ("px", "{image_size}"), ("tokens", "{tokens}"),
            ("params", "{params:,}"), ("images/s", "{images_s:rate}"),
            ("ms/image", "{ms_per_image:.3g}"), ("GFLOP/image", "{gflop_per_image:.3g}"),
            ("GFLOP/s", "{gflops_achieved:.1f}"), ("attention N² share", "{attention_share:.1%}"),
            ("peak MiB (batch)", "{peaks}"), ("MiB/image", "{mib_per_image:.3g}"),
            ("fixed MiB", "{fixed_mib:.1f}"), ("budget MiB", "{budget:,.0f}"),
            ("largest batch (projected)", "{largest}"),
            ("peak at it MiB (run)", "{largest_batch_peak_mib:,.0f}")), input_size_rows)),
}


def render_block(name: str) -> str:
    parts = BLOCKS[name]
    return parts() if callable(parts) else "\n\n".join(part.render() for part in parts)


def render(text: str, where: str = "the text") -> str:
    """text with every generated block rendered anew; a block whose name has no spec, or
    whose begin marker has no end, raises ValueError."""
    names = BEGIN.findall(text)
    unknown = sorted(set(names) - set(BLOCKS))
    if unknown:
        raise ValueError(f"{where} has generated blocks {unknown} that no spec makes; "
                         f"known: {sorted(BLOCKS)}")
    closed = [match.group(2) for match in BLOCK.finditer(text)]
    if closed != names:
        raise ValueError(f"{where}: blocks {sorted(set(names) - set(closed))} have a begin "
                         f"marker without its end marker")
    return BLOCK.sub(lambda m: m.group(1) + render_block(m.group(2)) + "\n" + m.group(4), text)


def doc_pages() -> list[str]:
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


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
