"""Markdown tables from saved reports: speed (with utilisation against the run's matmul peak)
and peak memory. A row's jit_compile is what its model was compiled with: XLA on TensorFlow and
JAX, torch.compile on PyTorch and for timm."""

from benchmarks.machine import machines_sentence


def matmul_key(backend: str, framework: str, precision: str) -> str:
    """The report's name for a matmul peak: Keras' on this backend, or torch's (timm's)."""
    return f"keras-{backend}-{precision}" if framework == "keras" else f"torch-{precision}"


def framework_of(implementation: str) -> str:
    return "torch" if implementation.startswith("timm") else "keras"


def result_matmul_key(report: dict, result: dict) -> str:
    """The matmul peak a result is measured against: its framework's, at its precision."""
    return matmul_key(report["backend"], framework_of(result["implementation"]),
                      result["precision"])


def run_peaks(report: dict) -> dict:
    """Per matmul key, the highest median GFLOP/s the run measured, in the sweep at its start
    or beside any model: a peak is the most the machine did, and a single reading can dip."""
    peaks = dict(report["matmul_gflops"])
    for r in report["results"]:
        key = result_matmul_key(report, r)
        peaks[key] = max(peaks[key], r["matmul_gflops_s"])
    return peaks


def utilisation(report: dict, result: dict) -> float:
    return result["infer_gflops_s"] / run_peaks(report)[result_matmul_key(report, result)]


def format_rate(value) -> str:
    """Images/s with two decimals below 10 (B/16 at 384 px runs under 1), one above."""
    if value is None:
        return "not run"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def format_ms(value) -> str:
    return "not run" if value is None else f"{value:.1f}"


def format_mib(value) -> str:
    return "not run" if value is None else f"{value:,.0f}"


def format_jit(value) -> str:
    return str(value).lower()


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table: the header, its separator, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def markdown(reports: list[dict], footer: bool = True) -> str:
    """The speed table from one or more --json reports (footer: the matmul peaks utilisation
    divides by, input pipeline rates and machines)."""
    rows = [[report["backend"], r["variant"], r["image_size"], r["batch"], r["precision"],
             r["implementation"], format_jit(r["jit_compile"]), format_rate(r["infer_images_s"]),
             format_ms(r["latency_ms"]), format_rate(r["train_images_s"]),
             f"{r['gflops_per_image']:.2f}", f"{utilisation(report, r):.0%}"]
            for report in reports for r in report["results"]]
    text = table(["backend", "variant", "px", "batch", "precision", "implementation",
                  "jit_compile", "infer img/s", "latency ms (b1)", "train img/s", "GFLOP/img",
                  "% of matmul peak"], rows)
    if not footer:
        return text
    peaks = "; ".join(f"{k} {v:.0f}" for report in reports for k, v in run_peaks(report).items())
    pipeline = ", ".join(f"{r['backend']} {r['pipeline_images_s']:.0f}" for r in reports)
    return text + (
        "\n\n% of matmul peak: inference GFLOP/s over the run's peak, the highest median GFLOP/s "
        "of a square matmul it measured, in a sweep of sizes at its start or in the turns "
        f"beside each model (torch's for timm, the backend's for the rest): {peaks}. "
        f"Main job input pipeline alone (images/s): {pipeline}. {machines_sentence(reports)}")


def memory_markdown(reports: list[dict]) -> str:
    """The peak-memory table from one or more --memory reports."""
    rows = [[report["backend"], r["variant"], r["image_size"], r["batch"], r["precision"],
             r["implementation"], format_jit(r["jit_compile"]), f"{r['params'] * 4 / 2**20:,.0f}",
             format_mib(r["infer_peak_mib"]), format_mib(r["train_peak_mib"]),
             format_mib(r["train_again_peak_mib"])]
            for report in reports for r in report["memory"]]
    return table(["backend", "variant", "px", "batch", "precision", "implementation",
                  "jit_compile", "weights MiB", "inference peak MiB", "training peak MiB",
                  "second training step MiB"], rows)


def overhead_markdown(reports: list[dict], names: list[str] | None = None) -> str:
    """Milliseconds per forward pass (inference, no gradients) and per training step of each
    implementation, and their ratio to timm's, eager rows against timm eager and compiled ones
    (jit_compile true) against timm under torch.compile, where the report has it. names: each
    report's name, a last column where given, since each run times its own timm."""
    rows = []
    for report, name in zip(reports, names or [None] * len(reports), strict=True):
        ms = {r["implementation"]: (1000 * r["batch"] / r["infer_images_s"],
                                    1000 * r["batch"] / r["train_images_s"])
              for r in report["results"]}
        for r in report["results"]:
            peer = "timm-compile" if r["jit_compile"] is True and "timm-compile" in ms else "timm"
            forward, train = ms[r["implementation"]]
            rows.append([report["backend"], r["implementation"], format_jit(r["jit_compile"]),
                         f"{forward:.1f}", f"{forward / ms[peer][0]:.2f}x {peer}",
                         f"{train:.1f}", f"{train / ms[peer][1]:.2f}x {peer}",
                         *([f"`{name}`"] if name else [])])
    return table(["backend", "implementation", "jit_compile", "forward ms", "forward vs timm",
                  "train step ms", "train step vs timm", *(["report"] if names else [])], rows)
