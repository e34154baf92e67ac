"""Benchmarks our ViT against timm (PyTorch) and keras-hub in the same run: inference
images/s (batch 32 by default) and latency (batch 1), training images/s, model GFLOPs and
utilisation against the matmul peak measured here.

python -m benchmarks.bench [--variants Ti/16 S/16 B/16 main] [--precisions float32 bfloat16]
                           [--batch 32 ...] [--peers timm keras-hub] [--jit-compile auto true]
                           [--json bench.json] [--smoke] [--memory]
                           [--device cpu|cuda|gpu] [--threads N] [--skip-latency]

Run it once per backend (KERAS_BACKEND=...); peers that are not installed are reported as
unavailable. Medians over --repeats timed samples after --warmup untimed calls, the
implementations taking turns sample by sample; a sample repeats a fast call for --min-sample
seconds. --memory measures peak memory instead, each implementation in a process of its own.
On an accelerator (--device, by default the backend's), inputs and timm sit on the device, each
call waits for it, the matmul peak is measured there, and the device's peak memory is recorded.
"""

# torch and timm (which loads torch._dynamo) before TensorFlow, or the process segfaults.
try:
    import timm  # noqa: F401
    import torch  # noqa: F401
except ImportError:  # timm is an optional peer
    pass

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402

import keras  # noqa: E402

from benchmarks import JIT_COMPILE, render, write_json  # noqa: E402
from benchmarks.device import ACCELERATORS, check_device, device_name  # noqa: E402
from benchmarks.machine import describe_machine  # noqa: E402
from benchmarks.memory import measure_memory, memory_child  # noqa: E402
from benchmarks.runners import (  # noqa: E402
    TRAIN_FLOPS_PER_FORWARD,
    forward_flops,
    model_spec,
    peers_available,
    runner_factories,
)
from benchmarks.tables import framework_of, matmul_key, result_matmul_key, run_peaks  # noqa: E402
from benchmarks.timing import (  # noqa: E402
    device_peaks,
    matmul_peak,
    measure_in_turns,
    square_matmul,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["Ti/16", "S/16", "B/16", "main"])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, nargs="+",
                        help="inference and training batch sizes, 32 unless given (several: a "
                             "scaling sweep)")
    parser.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--peers", nargs="*", default=["timm", "keras-hub"])
    parser.add_argument("--jit-compile", nargs="+", choices=list(JIT_COMPILE), default=["auto"],
                        help="model.compile's jit_compile for our model, one row each (default "
                             "auto: Keras' choice); keras-hub always gets auto")
    parser.add_argument("--torch-compile", action="store_true",
                        help="also measure timm under torch.compile (ours: --jit-compile true "
                             "on the torch backend)")
    parser.add_argument("--exact-gelu", action="store_true",
                        help="also measure our model with the exact (erf) GELU of timm and "
                             "keras-hub instead of the official checkpoints' tanh GELU")
    parser.add_argument("--skip-training", action="store_true",
                        help="inference only (for large models and resolutions)")
    parser.add_argument("--skip-latency", action="store_true",
                        help="no batch-1 latency (a compiled model would compile for it again)")
    parser.add_argument("--device",
                        help="the device to measure on, which must be the backend's (cpu, cuda "
                             "on PyTorch, gpu or tpu); default: the backend's")
    parser.add_argument("--threads", type=int,
                        help="CPU threads for torch (ours on PyTorch, timm) and TensorFlow; "
                             "default: the frameworks' own")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-sample", type=float, default=0.5,
                        help="seconds a timed sample lasts at least: a faster call is repeated "
                             "within it")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, batch 2, one repetition: checks the benchmark runs")
    parser.add_argument("--memory", action="store_true",
                        help="instead of timing, measure each implementation's peak memory "
                             "(first inference call, then first training step) in a process "
                             "of its own")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    return parser


def measure_speed(args, peers) -> dict:
    """The matmul peaks and every implementation's rates."""
    backend = keras.backend.backend()
    device = check_device(args.device)
    sizes = ((128, 256) if args.smoke else (4096, 8192) if device in ACCELERATORS
             else (1024, 2048, 3072))
    report = {"machine": describe_machine(), "backend": backend, "peers": peers,
              "device": {"kind": device, "name": device_name()}, "threads": args.threads,
              "matmul_gflops": {}, "matmul_size": {}, "results": []}
    frameworks = ["keras"] + (["torch"] if peers.get("timm") is True else [])
    for precision in args.precisions:
        for framework in frameworks:
            key = matmul_key(backend, framework, precision)
            report["matmul_gflops"][key], report["matmul_size"][key] = matmul_peak(
                framework, precision, sizes, args.repeats)
    for variant in args.variants:
        config, image_size = model_spec(variant, args.image_size)
        flops = forward_flops(config, image_size)
        for precision in args.precisions:
            for batch in args.batch:
                runners = {name: build() for name, build in runner_factories(
                    config, image_size, precision, batch, peers, args.jit_compile,
                    args.torch_compile, args.exact_gelu).items()}
                matmuls = {}
                for framework in frameworks:
                    size = report["matmul_size"][matmul_key(backend, framework, precision)]
                    matmuls[framework] = (square_matmul(framework, precision, size), 2 * size**3)
                memory = device_peaks(runners, train=not args.skip_training)
                measured, peaks = measure_in_turns(runners, batch, args.repeats, args.warmup,
                                                   train=not args.skip_training, matmuls=matmuls,
                                                   min_sample_s=args.min_sample,
                                                   latency=not args.skip_latency)
                del runners, matmuls
                keras.backend.clear_session()
                for name, result in measured.items():
                    result.update(implementation=name, variant=variant, image_size=image_size,
                                  batch=batch, precision=precision,
                                  gflops_per_image=flops / 1e9,
                                  infer_gflops_s=result["infer_images_s"] * flops / 1e9,
                                  train_gflops_s=train_gflops_s(result, flops),
                                  matmul_gflops_s=peaks[framework_of(name)],
                                  device_peak_mib=memory[name])
                    report["results"].append(result)
                    print(f"{variant:>6} {image_size:>3}px b{batch:<3} {precision:>8} "
                          f"{name:>12}: infer {result['infer_images_s']:8.1f} img/s, latency "
                          f"{result['latency_ms'] or 0:7.1f} ms, train "
                          f"{result['train_images_s'] or 0:8.1f} img/s, inference "
                          f"{result['infer_gflops_s']:.0f} GFLOP/s beside a matmul's "
                          f"{result['matmul_gflops_s']:.0f}", flush=True)
    for result in report["results"]:
        result.update(shares_of_peak(report, result))
    return report


def train_gflops_s(result: dict, flops: float) -> float | None:
    """A training step's GFLOP/s: TRAIN_FLOPS_PER_FORWARD forward passes' FLOPs per image."""
    if result["train_images_s"] is None:
        return None
    return result["train_images_s"] * TRAIN_FLOPS_PER_FORWARD * flops / 1e9


def shares_of_peak(report: dict, result: dict) -> dict:
    """Inference's and training's GFLOP/s over the run's matmul peak for the result's
    framework and precision."""
    peak = run_peaks(report)[result_matmul_key(report, result)]
    train = result["train_gflops_s"]
    return {"infer_share_of_peak": result["infer_gflops_s"] / peak,
            "train_share_of_peak": None if train is None else train / peak}


def set_threads(threads: int | None) -> None:
    """Limits torch (ours on PyTorch, timm) and TensorFlow to `threads` CPU threads."""
    if not threads:
        return
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:  # neither the torch backend nor timm
        pass
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.memory_child:
        child = json.loads(args.memory_child)
        result = memory_child(child["spec"], child["options"])
        print(json.dumps(result))
        return result
    if len(set(args.jit_compile)) < len(args.jit_compile):
        raise SystemExit(f"--jit-compile lists a value twice: {' '.join(args.jit_compile)}")
    if args.smoke:
        args.variants, args.repeats, args.warmup, args.min_sample = ["smoke"], 1, 1, 0.01
    args.batch = args.batch or ([2] if args.smoke else [32])
    peers = peers_available(args.peers)
    set_threads(args.threads)
    if args.memory:
        report = {"machine": describe_machine(), "backend": keras.backend.backend(),
                  "peers": peers, "memory": measure_memory(args, peers)}
        print(render.MEMORY.render([report]))
    else:
        report = measure_speed(args, peers)
        print(render.BENCH.render([report]))
        print(f"peers: {peers}")
    write_json(report, args.json)
    return report


if __name__ == "__main__":
    main()
