"""Renders README's generated blocks from the code and from the measured results kept in
docs/ (so every number in README comes from a command), and rewrites them with --write.

python -m apps.readme [--write]
"""

import argparse
import glob
import json
import os
import re

from apps.bench import machines_sentence
from apps.bench import markdown as bench_table
from apps.bench import memory_markdown as memory_table
from apps.variants import pretrained_table, variant_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def _json(path):
    with open(os.path.join(DOCS, path)) as file:
        return json.load(file)


def mainjob_block() -> str:
    result = _json("mainjob/result.json")
    return (f"Measured with `bash scripts/main.sh` on this project's 2-core CPU machine "
            f"(TensorFlow backend): **{result['test_accuracy']:.2%} test accuracy** on the "
            f"10,000 Fashion-MNIST test images after {result['epochs']} epochs, "
            f"{result['total_seconds'] / 60:.1f} minutes in all ({result['fit_seconds'] / 60:.1f}"
            f" of them in model.fit), top-5 {result['test_top5']:.2%}. The run's files are "
            f"copied to `docs/mainjob/`.")


def _export_table(report) -> str:
    rows = ["| format | size | max abs diff (probabilities) | top-1 agreement | "
            "latency ms/image | within tolerance |", "|---|---|---|---|---|---|"]
    for kind, r in report["formats"].items():
        rows.append(f"| {kind} | {r['size_bytes'] / 1024:.0f} KiB | "
                    f"{r['max_abs_diff_probabilities']:.2e} | {r['top1_agreement']:.2%} | "
                    f"{r['latency_ms_per_image']:.3f} | {'yes' if r['passed'] else '**no**'} |")
    return "\n".join(rows)


TI16_EXPORTS = {
    "32": "trained one epoch on Fashion-MNIST at 32 px and exported at that size",
    "224": ("the same model loaded at 224 px with its position embeddings resampled and not "
            "fine-tuned: the numbers are about the export, not the model's accuracy"),
}


def export_block() -> str:
    report = _json("export/export_report.json")
    images = next(iter(report["formats"].values()))["images"]
    text = (f"The main job's model ({report['model']}, input {report['input_shape']}), from "
            f"`python -m apps.export runs/fashion_mnist/model.keras --samples {images} "
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


def _reports(folder: str) -> list[dict]:
    return [_json(os.path.relpath(p, DOCS))
            for p in sorted(glob.glob(os.path.join(DOCS, folder, "*.json")))]


def bench_block(folder: str = "bench", footer: bool = True) -> str:
    return bench_table(_reports(folder), footer)


def bench_memory_block() -> str:
    reports = _reports(os.path.join("bench", "memory"))
    return memory_table(reports) + "\n\n" + machines_sentence(reports)


def bench_scaling_block() -> str:
    reports = _reports(os.path.join("bench", "scaling"))
    return bench_table(reports, footer=False) + "\n\n" + machines_sentence(reports)


def bench_xla_width_block() -> str:
    return bench_block(os.path.join("bench", "xla-width"))


def bench_avx2_block() -> str:
    return bench_block(os.path.join("bench", "avx2"))


BLOCKS = {"variants": variant_table, "pretrained": pretrained_table, "mainjob": mainjob_block,
          "export": export_block, "bench": bench_block,
          "benchscaling": bench_scaling_block, "benchmemory": bench_memory_block,
          "benchxlawidth": bench_xla_width_block, "benchavx2": bench_avx2_block}


def render(readme: str) -> str:
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        readme = pattern.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(2),
                             readme)
    return readme


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md in place")
    args = parser.parse_args(argv)
    path = os.path.join(ROOT, "README.md")
    with open(path) as file:
        current = file.read()
    rendered = render(current)
    if args.write:
        with open(path, "w") as file:
            file.write(rendered)
    print("README is up to date" if rendered == current else
          ("README rewritten" if args.write else "README differs: run with --write"))
    return rendered == current


if __name__ == "__main__":
    main()
