"""Timing: medians of calls taking turns, and the matmul peak that utilisation divides by."""

import math
import statistics
import time

import keras

from benchmarks.device import peak_memory_mib, reset_peak_memory, synchronize, torch_device


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def timed_in_turns(calls: dict, repeats: int, warmup: int, min_sample_s: float = 0.0) -> dict:
    """Median seconds of each call, timed one sample of each per round (the first rotating), so
    that a shared machine's drift falls on every implementation alike. A sample repeats a fast
    call until it lasts about min_sample_s (counted from one untimed call after the warmup):
    single calls of a few milliseconds are at the mercy of the scheduler's jitter."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    calls_per_sample = dict.fromkeys(names, 1)
    if min_sample_s:
        for name in names:
            once = max(timed(calls[name]), 1e-6)
            calls_per_sample[name] = max(1, math.ceil(min_sample_s / once))
    times = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            for _ in range(calls_per_sample[name]):
                calls[name]()
            times[name].append((time.perf_counter() - started) / calls_per_sample[name])
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def device_peaks(runners: dict, train: bool) -> dict:
    """Per runner, the device's peak memory in MiB over one inference call and (train) one
    training step, runner by runner; None where the device reports none (a CPU)."""
    peaks = {}
    for name, runner in runners.items():
        framework = "torch" if name.startswith("timm") else "keras"
        reset_peak_memory(framework)
        runner["infer"]()
        if train:
            runner["train"]()
        peaks[name] = peak_memory_mib(framework)
    return peaks


def measure_in_turns(runners: dict, batch, repeats, warmup, train=True, matmuls=None,
                     min_sample_s=0.0, latency=True):
    """Inference, batch-1 latency (latency) and (train) training rates of every runner, in
    turns; and the GFLOP/s of each square matmul in matmuls ({framework: (call, flop)}), timed
    in the inference turns so that utilisation divides rates measured side by side."""
    matmuls = matmuls or {}
    kinds = ["infer"] + (["latency"] if latency else []) + (["train"] if train else [])
    seconds = {}
    for kind in kinds:
        calls = {name: r[kind] for name, r in runners.items()}
        if kind == "infer":
            calls.update({f"matmul-{framework}": call for framework, (call, _) in matmuls.items()})
        seconds[kind] = timed_in_turns(calls, repeats, warmup, min_sample_s)
    results = {name: {"params": r["params"], "jit_compile": r["jit_compile"],
                      "infer_images_s": batch / seconds["infer"][name],
                      "latency_ms": seconds["latency"][name] * 1000 if latency else None,
                      "train_images_s": batch / seconds["train"][name] if train else None}
               for name, r in runners.items()}
    peaks = {framework: flop / seconds["infer"][f"matmul-{framework}"] / 1e9
             for framework, (_, flop) in matmuls.items()}
    return results, peaks


def square_matmul(framework: str, precision: str, size: int):
    """A call that multiplies two size x size matrices and waits for the product: Keras' on its
    backend's device, or torch's on the device the torch peers use."""
    if framework == "keras":
        a = keras.ops.ones((size, size), dtype=precision)
        return lambda: keras.ops.convert_to_numpy(
            keras.ops.cast(keras.ops.matmul(a, a)[0, 0], "float32"))
    import torch

    device = torch_device()
    a = torch.ones(size, size, dtype=getattr(torch, precision), device=device)

    def multiply():
        a @ a
        synchronize(device)

    return multiply


def matmul_peak(framework: str, precision: str, sizes, repeats: int) -> tuple[float, int]:
    """The median GFLOP/s of square matmuls at the size where that median is highest, and that
    size: the machine's practical peak for that framework (one size alone can dip below its
    neighbours). Medians, since a single call can be lucky."""
    rates = {}
    for size in sizes:
        call = square_matmul(framework, precision, size)
        call()
        rates[size] = 2 * size**3 / statistics.median(timed(call) for _ in range(repeats)) / 1e9
    size = max(rates, key=rates.get)
    return rates[size], size
