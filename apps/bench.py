"""Benchmarks our ViT against timm (PyTorch) and keras-hub in the same run: inference
images/s (batch 32 by default) and latency (batch 1), training images/s, model GFLOPs and
utilisation against the matmul peak measured here, and the main job's input pipeline.

python -m apps.bench [--variants Ti/16 S/16 B/16 main] [--precisions float32 bfloat16]
                     [--batch 32 ...] [--peers timm keras-hub] [--json bench.json] [--smoke]
                     [--memory]

Run it once per backend (KERAS_BACKEND=...); peers that are not installed are reported as
unavailable. Medians over --repeats timed samples after --warmup untimed calls, the
implementations taking turns sample by sample; a sample repeats a fast call for --min-sample
seconds. --memory measures peak memory instead, each implementation in a process of its own.
"""

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

# torch and timm (which loads torch._dynamo) before TensorFlow, or the process segfaults.
try:
    import timm
    import torch
except ImportError:  # timm is an optional peer
    timm = torch = None

import keras  # noqa: E402
import numpy as np  # noqa: E402

import vit_keras as vk  # noqa: E402
from apps.train import MAIN_JOB_MODEL  # noqa: E402
from vit_keras import training  # noqa: E402
from vit_keras.cpu import cpu_flags, first_cpu_info  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE_MODEL = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, patch_size=8)


def model_spec(name: str, image_size: int) -> tuple[vk.ViTConfig, int]:
    if name == "main":
        shape = {k: MAIN_JOB_MODEL[k] for k in
                 ("hidden_size", "num_layers", "num_heads", "mlp_dim", "patch_size")}
        return vk.ViTConfig(**shape), MAIN_JOB_MODEL["image_size"]
    if name == "smoke":
        return vk.ViTConfig(**SMOKE_MODEL), 32
    return vk.get_config(name), image_size


def forward_flops(config: vk.ViTConfig, image_size: int, num_classes: int = 1000) -> float:
    """2 x multiply-accumulates of one forward pass (token classifier)."""
    patches = (image_size // config.patch_size) ** 2
    tokens, d, m = patches + 1, config.hidden_size, config.mlp_dim
    macs = patches * config.patch_size**2 * 3 * d
    macs += config.num_layers * (4 * tokens * d * d + 2 * tokens * tokens * d + 2 * tokens * d * m)
    return 2.0 * (macs + d * num_classes)


def keras_runner(build, image_size, precision, batch, jit_compile="auto") -> dict:
    """A Keras classifier made by build() under the precision's dtype policy, and its calls.
    jit_compile: model.compile's, or a function of the model that returns it."""
    keras.config.set_dtype_policy("mixed_bfloat16" if precision == "bfloat16" else "float32")
    try:
        model = build()
        model.compile(keras.optimizers.Adam(1e-4),
                      keras.losses.CategoricalCrossentropy(from_logits=True),
                      jit_compile=jit_compile(model) if callable(jit_compile) else jit_compile)
    finally:
        keras.config.set_dtype_policy("float32")
    x = np.random.default_rng(0).uniform(-1, 1, (batch, image_size, image_size, 3))
    x = x.astype("float32")
    y = np.eye(1000, dtype="float32")[np.arange(batch) % 1000]
    return {"params": model.count_params(), "jit_compile": model.jit_compile,
            "infer": lambda: model.predict_on_batch(x),
            "latency": lambda: model.predict_on_batch(x[:1]),
            "train": lambda: model.train_on_batch(x, y)}


def ours_runner(config, image_size, precision, batch, jit_compile=None, approximate_gelu=True):
    """Compiled as our training recipes compile unless jit_compile is given; keras-hub gets
    Keras' "auto", what its users get without flags. approximate_gelu=False: the exact GELU
    that timm and keras-hub compute, for a like-for-like comparison."""
    return keras_runner(lambda: vk.vit(config, image_size=image_size, num_classes=1000,
                                       approximate_gelu=approximate_gelu),
                        image_size, precision, batch,
                        training.default_jit_compile if jit_compile is None else jit_compile)


def keras_auto_skips_xla() -> bool:
    """Whether Keras' jit_compile="auto" leaves XLA off, so that our default decides by the
    precision and the width: on TensorFlow without an accelerator (then the benchmark also
    times us with the other choice)."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return all(device.device_type == "CPU" for device in tf.config.list_physical_devices())


def timm_runner(config, image_size, precision, batch, compiled=False) -> dict:
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=image_size, patch_size=config.patch_size, embed_dim=config.hidden_size,
        depth=config.num_layers, num_heads=config.num_heads,
        mlp_ratio=config.mlp_dim / config.hidden_size, num_classes=1000)
    x = torch.randn(batch, 3, image_size, image_size)
    y = torch.arange(batch) % 1000
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bfloat16" \
        else (lambda: torch.autocast("cpu", enabled=False))
    step_model = torch.compile(model) if compiled else model
    optimizer = torch.optim.Adam(model.parameters(), 1e-4)

    def infer(images):
        with torch.no_grad(), autocast():
            step_model.eval()(images)

    def train_step():
        with autocast():
            loss = torch.nn.functional.cross_entropy(step_model.train()(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return {"params": sum(p.numel() for p in model.parameters()), "jit_compile": compiled,
            "infer": lambda: infer(x), "latency": lambda: infer(x[:1]), "train": train_step}


def keras_hub_runner(config, image_size, precision, batch):
    import keras_hub

    def build():
        backbone = keras_hub.models.ViTBackbone(
            image_shape=(image_size, image_size, 3), patch_size=config.patch_size,
            num_layers=config.num_layers, num_heads=config.num_heads,
            hidden_dim=config.hidden_size, mlp_dim=config.mlp_dim)
        inputs = keras.Input((image_size, image_size, 3))
        pooled = backbone(inputs)[:, 0]
        return keras.Model(inputs, keras.layers.Dense(1000, dtype="float32")(pooled))

    return keras_runner(build, image_size, precision, batch)


def runner_factories(config, image_size, precision, batch, peers, torch_compile=False,
                     exact_gelu=False) -> dict:
    """Every implementation the run measures, by name, as a function that builds its runner."""
    make = {"vit_keras": lambda: ours_runner(config, image_size, precision, batch)}
    if keras_auto_skips_xla():  # the XLA choice our default did not make
        xla = not training.xla_pays_off_on_tensorflow_cpu(precision, config.hidden_size)
        make["vit_keras-xla" if xla else "vit_keras-no-xla"] = lambda: ours_runner(
            config, image_size, precision, batch, jit_compile=xla)
    if exact_gelu:
        make["vit_keras-erf-gelu"] = lambda: ours_runner(config, image_size, precision, batch,
                                                         approximate_gelu=False)
    if torch_compile and keras.backend.backend() == "torch":
        make["vit_keras-torch-compile"] = lambda: ours_runner(config, image_size, precision,
                                                              batch, jit_compile=True)
    if peers.get("timm") is True:
        make["timm"] = lambda: timm_runner(config, image_size, precision, batch)
        if torch_compile:
            make["timm-compile"] = lambda: timm_runner(config, image_size, precision, batch,
                                                       compiled=True)
    if peers.get("keras-hub") is True:
        make["keras-hub"] = lambda: keras_hub_runner(config, image_size, precision, batch)
    return make


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def timed_in_turns(calls: dict, repeats: int, warmup: int, min_sample_s: float = 0.0) -> dict:
    """Median seconds of each call, timed one sample of each per round (the first rotating), so
    that the shared machine's drift falls on every implementation alike. A sample repeats a
    fast call until it lasts about min_sample_s (counted from one untimed call after the
    warmup): single calls of a few milliseconds are at the mercy of the scheduler's jitter."""
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


def measure_in_turns(runners: dict, batch, repeats, warmup, train=True, matmuls=None,
                     min_sample_s=0.0):
    """Inference, batch-1 latency and (train) training rates of every runner, in turns; and the
    GFLOP/s of each square matmul in matmuls ({framework: (call, flop)}), timed in the
    inference turns so that utilisation divides rates measured side by side."""
    matmuls = matmuls or {}
    kinds = ["infer", "latency"] + (["train"] if train else [])
    seconds = {}
    for kind in kinds:
        calls = {name: r[kind] for name, r in runners.items()}
        if kind == "infer":
            calls.update({f"matmul-{framework}": call for framework, (call, _) in matmuls.items()})
        seconds[kind] = timed_in_turns(calls, repeats, warmup, min_sample_s)
    results = {name: {"params": r["params"], "jit_compile": r["jit_compile"],
                      "infer_images_s": batch / seconds["infer"][name],
                      "latency_ms": seconds["latency"][name] * 1000,
                      "train_images_s": batch / seconds["train"][name] if train else None}
               for name, r in runners.items()}
    peaks = {framework: flop / seconds["infer"][f"matmul-{framework}"] / 1e9
             for framework, (_, flop) in matmuls.items()}
    return results, peaks


def square_matmul(framework: str, precision: str, size: int):
    """A call that multiplies two size x size matrices and waits for the product."""
    if framework == "keras":
        a = keras.ops.ones((size, size), dtype=precision)
        return lambda: keras.ops.convert_to_numpy(
            keras.ops.cast(keras.ops.matmul(a, a)[0, 0], "float32"))
    a = torch.ones(size, size, dtype=getattr(torch, precision))
    return lambda: a @ a


def matmul_peak(framework: str, precision: str, sizes, repeats: int) -> tuple[float, int]:
    """The median GFLOP/s of square matmuls at the size where that median is highest, and that
    size: the machine's practical peak for that framework (one size alone can dip: TensorFlow's
    2048 ran ~20% below its 1024 and 3072 here). Medians, since a single call can be lucky."""
    rates = {}
    for size in sizes:
        call = square_matmul(framework, precision, size)
        call()
        rates[size] = 2 * size**3 / statistics.median(timed(call) for _ in range(repeats)) / 1e9
    size = max(rates, key=rates.get)
    return rates[size], size


def pipeline_throughput(batches: int) -> float:
    """Images/s the main job's training pipeline delivers on its own."""
    from vit_keras import data

    images = np.random.default_rng(0).integers(0, 256, (8192, 28, 28, 1), dtype=np.uint8)
    recipe = training.RECIPES["fashion_mnist"]
    dataset = data.make_pipeline(data.from_arrays(images, np.arange(8192) % 10),
                                 image_size=28, num_classes=10, batch_size=128, training=True,
                                 crop=recipe.crop, flip=recipe.flip).repeat()
    iterator = iter(dataset)
    next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * 128 / (time.perf_counter() - started)


def _process_mib(field: str) -> float:
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


def peak_memory_of(runner: dict, train: bool) -> dict:
    """MiB above the built model's resident memory at the peak of its first inference call
    and, after it, of its first training step: compilation and optimizer state included,
    what a user's process needs on top of the weights and the libraries. Then the peak of a
    second training step, above the same baseline: what a training loop holds once compiled
    (whatever the first step left resident, its optimizer state and caches, counts)."""
    release_free_memory()
    resident = _process_mib("VmRSS")
    result = {"resident_mib": resident, "infer_peak_mib": _peak_above(resident, runner["infer"]),
              "train_peak_mib": None, "train_again_peak_mib": None}
    if train:
        result["train_peak_mib"] = _peak_above(resident, runner["train"])
        result["train_again_peak_mib"] = _peak_above(resident, runner["train"])
    return result


def _peak_above(resident: float, call) -> float:
    """The call's peak in MiB above `resident`. Free heap pages go back first: once large
    blocks come from the heap rather than their own mappings (as after the README's
    variant table built every model on PyTorch), a freed inference batch would otherwise stay
    resident and be added to the training step's peak."""
    release_free_memory()
    reset_peak_memory()
    call()
    return _process_mib("VmHWM") - resident


def memory_child(spec: dict) -> dict:
    """One implementation's peak memory, measured in this process (started for it alone)."""
    config, image_size = model_spec(spec["variant"], spec["image_size"])
    build = runner_factories(config, image_size, spec["precision"], spec["batch"],
                             {"timm": True, "keras-hub": True}, torch_compile=True,
                             exact_gelu=True)[spec["implementation"]]
    runner = build()
    return {"params": runner["params"], "jit_compile": runner["jit_compile"],
            **peak_memory_of(runner, spec["train"])}


def measure_memory(args, peers) -> list[dict]:
    """Every implementation's peak memory, each in a fresh process: a process's peak cannot be
    split between implementations that ran in it."""
    results = []
    for variant in args.variants:
        config, image_size = model_spec(variant, args.image_size)
        for precision in args.precisions:
            for batch in args.batch:
                for name in runner_factories(config, image_size, precision, batch, peers,
                                             args.torch_compile, args.exact_gelu):
                    spec = dict(implementation=name, variant=variant, image_size=image_size,
                                batch=batch, precision=precision, train=not args.skip_training)
                    done = subprocess.run(
                        [sys.executable, "-m", "apps.bench", "--memory-child", json.dumps(spec)],
                        capture_output=True, text=True, cwd=ROOT, check=False)
                    if done.returncode:
                        raise RuntimeError(f"the memory run of {spec} failed:\n"
                                           f"{done.stderr[-3000:]}")
                    results.append({**spec, **json.loads(done.stdout.splitlines()[-1])})
                    print(f"{variant:>6} {image_size:>3}px b{batch:<3} {precision:>8} "
                          f"{name:>12}: peak {results[-1]['infer_peak_mib']:.0f} MiB inference, "
                          f"{_mib(results[-1]['train_peak_mib'])} MiB training, "
                          f"{_mib(results[-1]['train_again_peak_mib'])} MiB again", flush=True)
    return results


def _mib(value) -> str:
    return "not run" if value is None else f"{value:,.0f}"


def memory_markdown(reports: list[dict]) -> str:
    """README's peak-memory table from one or more --memory reports."""
    rows = ["| backend | variant | px | batch | precision | implementation | weights MiB | "
            "inference peak MiB | training peak MiB | second training step MiB |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for report in reports:
        for r in report["memory"]:
            rows.append(f"| {report['backend']} | {r['variant']} | {r['image_size']} | "
                        f"{r['batch']} | {r['precision']} | {r['implementation']} | "
                        f"{r['params'] * 4 / 2**20:,.0f} | {_mib(r['infer_peak_mib'])} | "
                        f"{_mib(r['train_peak_mib'])} | {_mib(r['train_again_peak_mib'])} |")
    return "\n".join(rows)


ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


def backend_devices() -> list[str]:
    """The devices the Keras backend computes on (torch's backend has no keras.distribution)."""
    if keras.backend.backend() == "torch":
        from torch import cuda

        return [f"cuda:{i}" for i in range(cuda.device_count())] or ["cpu:0"]
    return keras.distribution.list_devices()


def describe_machine() -> dict:
    """What the rates depend on: the CPU, its cores and vector extensions, memory, devices."""
    cpu = first_cpu_info().get("model name") or platform.processor() or platform.machine()
    flags = cpu_flags()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "logical_cores": os.cpu_count(),
            "isa": [flag for flag in ISA_FLAGS if flag in flags],
            "memory_gib": round(memory, 1), "devices": backend_devices(),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}


def machines_sentence(reports: list[dict]) -> str:
    """The machines the reports were measured on, for the line under a README table; where
    they differ, which backends' rows each one measured."""
    backends_on = {}
    for report in reports:
        backends_on.setdefault(machine_line(report["machine"]), set()).add(report["backend"])
    if len(backends_on) == 1:
        return f"Machine: {next(iter(backends_on))}."
    return "Machines: " + "; ".join(
        f"{', '.join(sorted(backends))} on {line}"
        for line, backends in sorted(backends_on.items(), key=lambda item: sorted(item[1]))) + "."


def machine_line(machine: dict) -> str:
    isa = ", ".join(machine["isa"]) or "none of " + ", ".join(ISA_FLAGS)
    return (f"{machine['cpu']}, {machine['logical_cores']} logical cores ({isa}), "
            f"{machine['memory_gib']:.0f} GiB, devices {', '.join(machine['devices'])}")


def peers_available(names):
    available = {}
    for name in names:
        module = {"timm": "timm", "keras-hub": "keras_hub"}[name]
        try:
            __import__(module)
            available[name] = True
        except ImportError as err:
            available[name] = f"unavailable ({err})"
    return available


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
    or beside any model: a peak is the most the machine did. The matmul beside JAX's B/16 at
    batch 8 alone read 86 GFLOP/s against 104-124 beside batch 1 and 32, which put B/16 at
    118%."""
    peaks = dict(report["matmul_gflops"])
    for r in report["results"]:
        key = result_matmul_key(report, r)
        peaks[key] = max(peaks[key], r["matmul_gflops_s"])
    return peaks


def utilisation(report: dict, result: dict) -> float:
    return result["infer_gflops_s"] / run_peaks(report)[result_matmul_key(report, result)]


def _rate(value) -> str:
    """Images/s with two decimals below 10 (B/16 at 384 px runs under 1), one above."""
    if value is None:
        return "not run"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def markdown(reports: list[dict], footer: bool = True) -> str:
    """README's performance table from one or more --json reports (footer: how utilisation
    is measured, the matmul sweeps, input pipeline rates and machines)."""
    rows = ["| backend | variant | px | batch | precision | implementation | infer img/s | "
            "latency ms (b1) | train img/s | GFLOP/img | % of matmul peak |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for report in reports:
        for r in report["results"]:
            rows.append(f"| {report['backend']} | {r['variant']} | {r['image_size']} | "
                        f"{r['batch']} | {r['precision']} | {r['implementation']} | "
                        f"{_rate(r['infer_images_s'])} | {r['latency_ms']:.1f} | "
                        f"{_rate(r['train_images_s'])} | {r['gflops_per_image']:.2f} | "
                        f"{utilisation(report, r):.0%} |")
    if not footer:
        return "\n".join(rows)
    peaks = "; ".join(f"{k} {v:.0f}" for report in reports for k, v in run_peaks(report).items())
    pipeline = ", ".join(f"{r['backend']} {r['pipeline_images_s']:.0f}" for r in reports)
    return "\n".join(rows) + (
        "\n\n% of matmul peak: inference GFLOP/s over the run's peak, the highest median GFLOP/s "
        "of a square matmul it measured, in a sweep of sizes at its start or in the turns "
        f"beside each model (torch's for timm, the backend's for the rest): {peaks}. "
        f"Main job input pipeline alone (images/s): {pipeline}. {machines_sentence(reports)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["Ti/16", "S/16", "B/16", "main"])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, nargs="+",
                        help="inference and training batch sizes, 32 unless given (several: a "
                             "scaling sweep)")
    parser.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--peers", nargs="*", default=["timm", "keras-hub"])
    parser.add_argument("--torch-compile", action="store_true",
                        help="also measure timm under torch.compile, and on the torch backend "
                             "our model with jit_compile=True (Keras' torch.compile; slow to "
                             "compile)")
    parser.add_argument("--exact-gelu", action="store_true",
                        help="also measure our model with the exact (erf) GELU of timm and "
                             "keras-hub instead of the official checkpoints' tanh GELU")
    parser.add_argument("--skip-training", action="store_true",
                        help="inference only (for large models and resolutions)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-sample", type=float, default=0.5,
                        help="seconds a timed sample lasts at least: a faster call is repeated "
                             "within it (the main job's model infers a batch in 15-20 ms)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, batch 2, one repetition: checks the benchmark runs")
    parser.add_argument("--markdown", nargs="+", metavar="JSON",
                        help="print README's table from saved reports instead of measuring")
    parser.add_argument("--memory", action="store_true",
                        help="instead of timing, measure each implementation's peak memory "
                             "(first inference call, then first training step) in a process "
                             "of its own")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        result = memory_child(json.loads(args.memory_child))
        print(json.dumps(result))
        return result
    if args.markdown:
        reports = []
        for path in args.markdown:
            with open(path) as file:
                reports.append(json.load(file))
        print(memory_markdown(reports) if "memory" in reports[0] else markdown(reports))
        return reports
    if args.smoke:
        args.variants, args.repeats, args.warmup, args.min_sample = ["smoke"], 1, 1, 0.01
    args.batch = args.batch or ([2] if args.smoke else [32])
    backend = keras.backend.backend()
    peers = peers_available(args.peers)
    if peers.get("timm") is True and timm is None:
        peers["timm"] = "unavailable (timm or torch not importable)"
    if args.memory:
        report = {"machine": describe_machine(), "backend": backend, "peers": peers,
                  "memory": measure_memory(args, peers)}
        print(memory_markdown([report]))
        write_json(report, args.json)
        return report
    sizes = (128, 256) if args.smoke else (1024, 2048, 3072)
    report = {"machine": describe_machine(), "backend": backend, "peers": peers,
              "matmul_gflops": {}, "matmul_size": {}, "results": []}
    frameworks = ["keras"] + (["torch"] if peers.get("timm") is True else [])
    for precision in args.precisions:
        for framework in frameworks:
            key = matmul_key(backend, framework, precision)
            report["matmul_gflops"][key], report["matmul_size"][key] = matmul_peak(
                framework, precision, sizes, args.repeats)
    report["pipeline_images_s"] = pipeline_throughput(3 if args.smoke else 50)
    for variant in args.variants:
        config, image_size = model_spec(variant, args.image_size)
        flops = forward_flops(config, image_size)
        for precision in args.precisions:
            matmul_sizes = {framework: report["matmul_size"][matmul_key(backend, framework,
                                                                        precision)]
                            for framework in frameworks}
            for batch in args.batch:
                runners = {name: build() for name, build in runner_factories(
                    config, image_size, precision, batch, peers, args.torch_compile,
                    args.exact_gelu).items()}
                matmuls = {framework: (square_matmul(framework, precision, size), 2 * size**3)
                           for framework, size in matmul_sizes.items()}
                measured, peaks = measure_in_turns(runners, batch, args.repeats, args.warmup,
                                                   train=not args.skip_training, matmuls=matmuls,
                                                   min_sample_s=args.min_sample)
                del runners, matmuls
                keras.backend.clear_session()
                for name, result in measured.items():
                    framework = framework_of(name)
                    result.update(implementation=name, variant=variant, image_size=image_size,
                                  batch=batch, precision=precision,
                                  gflops_per_image=flops / 1e9,
                                  infer_gflops_s=result["infer_images_s"] * flops / 1e9,
                                  matmul_gflops_s=peaks[framework])
                    report["results"].append(result)
                    print(f"{variant:>6} {image_size:>3}px b{batch:<3} {precision:>8} "
                          f"{name:>12}: infer {result['infer_images_s']:8.1f} img/s, latency "
                          f"{result['latency_ms']:7.1f} ms, train "
                          f"{_rate(result['train_images_s'])} img/s, inference "
                          f"{result['infer_gflops_s']:.0f} GFLOP/s beside a matmul's "
                          f"{peaks[framework]:.0f}", flush=True)
    print(markdown([report]))
    print(f"input pipeline: {report['pipeline_images_s']:.0f} images/s; peers: {peers}")
    write_json(report, args.json)
    return report


def write_json(report: dict, path: str | None):
    if path:
        with open(path, "w") as file:
            json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
