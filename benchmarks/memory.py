"""Peak memory of each implementation's first inference call and training steps, each measured
in a process of its own: a process's peak cannot be split between implementations that ran in
it. Linux only (/proc/self/status, /proc/self/clear_refs)."""

import ctypes
import json
import os
import subprocess
import sys

from benchmarks.runners import model_spec, runner_factories

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def process_mib(field: str) -> float:
    """VmRSS (resident now) or VmHWM (its peak since the last reset) of this process, in MiB."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}: peak memory is read on Linux only")


def release_free_memory():
    """Hands the heap's free pages back to the system (glibc's malloc_trim), so that a call
    that reuses them counts them: memory freed by building the model stays resident."""
    ctypes.CDLL(None).malloc_trim(0)


def reset_peak_memory():
    """Lowers the process's peak (VmHWM) to what it holds now (Linux's clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as file:
        file.write("5")


def peak_above(resident: float, call) -> float:
    """The call's peak in MiB above `resident`. Free heap pages go back first, or a freed
    inference batch served from the heap would stay resident and count in the next peak."""
    release_free_memory()
    reset_peak_memory()
    call()
    return process_mib("VmHWM") - resident


def peak_memory_of(runner: dict, train: bool) -> dict:
    """MiB above the built model's resident memory at the peak of its first inference call
    and, after it, of its first training step: compilation and optimizer state included, what
    a user's process needs on top of the weights and the libraries. Then the peak of a second
    training step above the same baseline: what a training loop holds once compiled."""
    release_free_memory()
    resident = process_mib("VmRSS")
    result = {"resident_mib": resident, "infer_peak_mib": peak_above(resident, runner["infer"]),
              "train_peak_mib": None, "train_again_peak_mib": None}
    if train:
        result["train_peak_mib"] = peak_above(resident, runner["train"])
        result["train_again_peak_mib"] = peak_above(resident, runner["train"])
    return result


def memory_child(spec: dict, options: dict) -> dict:
    """One implementation's peak memory, measured in this process (started for it alone);
    options: runner_factories' keywords that name the implementations."""
    config, image_size = model_spec(spec["variant"], spec["image_size"])
    build = runner_factories(config, image_size, spec["precision"], spec["batch"],
                             {"timm": True, "keras-hub": True}, **options)[spec["implementation"]]
    runner = build()
    return {"params": runner["params"], "jit_compile": runner["jit_compile"],
            **peak_memory_of(runner, spec["train"])}


def run_child(spec: dict, options: dict, module: str = "benchmarks.bench") -> dict:
    """The memory child of `module` (benchmarks.bench's memory_child by default) in a fresh
    `python -m module --memory-child` process; its last line of output is the result."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--memory-child",
         json.dumps({"spec": spec, "options": options})],
        capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode:
        raise RuntimeError(f"the memory run of {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def measure_memory(args, peers) -> list[dict]:
    """Every implementation's peak memory for the variants, precisions and batch sizes of the
    command line, each in a fresh process."""
    options = dict(jit_compile=args.jit_compile, torch_compile=args.torch_compile,
                   exact_gelu=args.exact_gelu)
    results = []
    for variant in args.variants:
        config, image_size = model_spec(variant, args.image_size)
        for precision in args.precisions:
            for batch in args.batch:
                for name in runner_factories(config, image_size, precision, batch, peers,
                                             **options):
                    spec = dict(implementation=name, variant=variant, image_size=image_size,
                                batch=batch, precision=precision, train=not args.skip_training)
                    results.append({**spec, **run_child(spec, options)})
                    r = results[-1]
                    print(f"{variant:>6} {image_size:>3}px b{batch:<3} {precision:>8} "
                          f"{name:>12}: peak MiB of inference, training, training again: "
                          f"{r['infer_peak_mib']:.0f}, {r['train_peak_mib']}, "
                          f"{r['train_again_peak_mib']}", flush=True)
    return results
