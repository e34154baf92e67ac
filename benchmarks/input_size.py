"""The paper's Appendix D.5, the cost of resolution, on the CPU: for each variant and input
size, inference images/s, the forward FLOPs per image (from the model's shape) and the GFLOP/s
achieved, the share of those FLOPs in attention's quadratic term, and the largest batch that
fits in memory.

python -m benchmarks.input_size [--variants Ti/16 B/16] [--image-sizes 32 64 112 224 384]
    [--batch 8] [--repeats 3] [--smoke] [--json docs/paper/input_size.json]

The largest batch is projected from a linear fit, not run: the inference peak above the
process's resident memory (the model and its input batch) is measured at --batch and at a
second batch, twice it or more (see second_point), the line peak = fixed + per_image x batch
is drawn through the two, and the batch is the largest whose fitted peak plus its own input
images fits in the memory the host has available now (MemAvailable) less a safety margin.
Only where a warm-up and a measured call at that batch would take under MEMORY_SECONDS at the
measured rate does one run, and its peak is recorded (else null). Run it once per backend
(KERAS_BACKEND=...) on an otherwise idle machine: the rates and the available memory are the
host's at the time. --smoke runs the tiny model at 32 and 64 px, measuring nothing.
"""

import argparse
import gc
import math

import keras

from benchmarks import write_json
from benchmarks.device import device_kind
from benchmarks.machine import describe_machine
from benchmarks.memory import peak_memory_of
from benchmarks.runners import forward_flops, model_spec, ours_runner
from benchmarks.timing import timed_in_turns

SMOKE_IMAGE_SIZES = [32, 64]
# The share of the available memory the projection leaves spare: other processes' growth and
# allocator fragmentation, which the two measured batches do not show.
SAFETY_MARGIN = 0.1
# The longest a batch of the memory measurements may take, its warm-up and measured calls at
# the rate measured at --batch: the fit's second batch stops doubling there, and the projected
# batch runs only under it.
MEMORY_SECONDS = 20.0
# The growth of the peak over the first batch's that the fit's second batch is doubled to
# reach: the peak varies by a few MiB from call to call, more than a small model's few images
# add.
MIN_GROWTH_MIB = 16.0
PROJECTION = ("projected from the line through the peaks at the two measured batches to the "
              "memory budget (MemAvailable less the safety margin), not run")


def tokens(config, image_size: int) -> int:
    """Patches plus the class token: the sequence every block attends over."""
    return (image_size // config.patch_size) ** 2 + 1


def attention_share(config, image_size: int) -> float:
    """The share of forward_flops in attention's N^2 term, that formula's 2 x tokens^2 x hidden
    multiply-accumulates per block (the scores, and their product with the values)."""
    n = tokens(config, image_size)
    quadratic = 2.0 * config.num_layers * 2 * n * n * config.hidden_size
    return quadratic / forward_flops(config, image_size)


def available_mib() -> float:
    """MemAvailable in MiB: what the host can give a process now without swapping."""
    with open("/proc/meminfo") as file:
        for line in file:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable: the batch is projected on Linux only")


def built(config, image_size: int, batch: int) -> dict:
    """ours_runner in float32 with Keras' default jit_compile, built once the models before it
    are freed, so that their memory does not crowd this one's."""
    keras.backend.clear_session()
    gc.collect()
    return ours_runner(config, image_size, "float32", batch)


def rate_and_peak(config, image_size: int, batch: int, repeats: int) -> tuple[int, float, float]:
    """The model's parameters, the median seconds of an inference call at `batch` after a
    warm-up call, and then one call's peak MiB above the resident process."""
    runner = built(config, image_size, batch)
    seconds = timed_in_turns({"infer": runner["infer"]}, repeats, warmup=1)["infer"]
    return runner["params"], seconds, peak_memory_of(runner, train=False)["infer_peak_mib"]


def peak_at(config, image_size: int, batch: int) -> float:
    """A fresh model's inference peak MiB above the resident process at `batch`, measured on
    the call after a warm-up (which compiles, where jit_compile does), as at --batch."""
    runner = built(config, image_size, batch)
    runner["infer"]()
    return peak_memory_of(runner, train=False)["infer_peak_mib"]


def second_point(config, image_size: int, first: dict, seconds_per_image: float) -> dict:
    """The fit's second batch and its peak: twice the first batch, doubled until its peak is
    MIN_GROWTH_MIB above the first's or the next batch would take over MEMORY_SECONDS."""
    batch = 2 * first["batch"]
    while True:
        point = {"batch": batch, "peak_mib": peak_at(config, image_size, batch)}
        batch *= 2
        if (point["peak_mib"] - first["peak_mib"] >= MIN_GROWTH_MIB
                or 2 * batch * seconds_per_image > MEMORY_SECONDS):
            return point


def line_through(peaks: list[dict]) -> tuple[float, float]:
    """The fixed MiB and MiB per image of the line through two measured (batch, peak) points."""
    first, second = peaks
    per_image = (second["peak_mib"] - first["peak_mib"]) / (second["batch"] - first["batch"])
    return first["peak_mib"] - per_image * first["batch"], per_image


def largest_batch(fixed: float, per_image: float, input_mib: float, budget: float) -> int | None:
    """The largest batch whose fitted peak plus its input images fits in `budget` MiB; None
    where the peak did not grow with the batch (a small model's growth lost in the noise)."""
    if per_image <= 0:
        return None
    return max(0, math.floor((budget - fixed) / (per_image + input_mib)))


def checked_peak(config, image_size: int, batch: int | None, seconds_per_image: float):
    """The peak MiB measured at the projected batch, where its two calls take under
    MEMORY_SECONDS at the measured rate; None where they would not, or nothing was projected."""
    if not batch or 2 * batch * seconds_per_image > MEMORY_SECONDS:
        return None
    return peak_at(config, image_size, batch)


def measure_row(variant: str, image_size: int, batch: int, repeats: int) -> dict:
    """One variant at one input size: rate, FLOPs, the attention share and the memory fit."""
    config = model_spec(variant, image_size)[0]
    params, seconds, peak = rate_and_peak(config, image_size, batch, repeats)
    first = {"batch": batch, "peak_mib": peak}
    peaks = [first, second_point(config, image_size, first, seconds / batch)]
    fixed, per_image = line_through(peaks)
    input_mib = image_size * image_size * 3 * 4 / 2**20  # one float32 image
    available = available_mib()
    projected = largest_batch(fixed, per_image, input_mib, available * (1 - SAFETY_MARGIN))
    flops = forward_flops(config, image_size)
    return {"variant": variant, "image_size": image_size, "tokens": tokens(config, image_size),
            "params": params, "batch": batch, "images_s": batch / seconds,
            "ms_per_image": 1000 * seconds / batch, "gflop_per_image": flops / 1e9,
            "gflops_achieved": flops * batch / seconds / 1e9,
            "attention_share": attention_share(config, image_size), "peaks": peaks,
            "mib_per_image": per_image, "fixed_mib": fixed, "input_mib_per_image": input_mib,
            "available_mib": available, "largest_batch_projected": projected,
            "largest_batch_peak_mib": checked_peak(config, image_size, projected,
                                                   seconds / batch)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["Ti/16", "B/16"])
    parser.add_argument("--image-sizes", nargs="+", type=int, default=[32, 64, 112, 224, 384])
    parser.add_argument("--batch", type=int, default=8,
                        help="images per timed call, and the memory fit's first batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls, median taken")
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny model at 32 and 64 px: checks the command, measures nothing")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if device_kind() != "cpu":
        raise SystemExit(f"benchmarks.input_size measures the host's memory, on the CPU; the "
                         f"{keras.backend.backend()} backend computes on {device_kind()}: hide "
                         "the accelerator (CUDA_VISIBLE_DEVICES=, JAX_PLATFORMS=cpu)")
    variants = ["smoke"] if args.smoke else args.variants
    sizes = SMOKE_IMAGE_SIZES if args.smoke else args.image_sizes
    rows = []
    for variant in variants:
        for size in sizes:
            rows.append(measure_row(variant, size, args.batch, args.repeats))
            r = rows[-1]
            print(f"{variant:>6} {size:>3}px: {r['images_s']:.3g} images/s, "
                  f"{r['gflops_achieved']:.1f} GFLOP/s, attention N^2 "
                  f"{r['attention_share']:.0%}, {r['mib_per_image']:.3g} MiB/image, largest "
                  f"batch {r['largest_batch_projected']} (projected)", flush=True)
    report = {"machine": describe_machine(), "backend": keras.backend.backend(),
              "batch": args.batch, "repeats": args.repeats, "safety_margin": SAFETY_MARGIN,
              "memory_seconds": MEMORY_SECONDS, "min_growth_mib": MIN_GROWTH_MIB,
              "largest_batch": PROJECTION, "rows": rows}
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
