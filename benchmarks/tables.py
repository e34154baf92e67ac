"""Utilisation: a model's inference GFLOP/s over the matmul peak its run measured, PyTorch's
for timm and the Keras backend's for the Keras models."""


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
