"""What machine a measurement ran on: the CPU as Linux describes it in /proc/cpuinfo, its cores,
vector extensions and memory, and the Keras backend's devices. Rates depend on all of them, so
every report records them."""

import functools
import os
import platform

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
# The variables that cap the vector extensions PyTorch's own kernels, oneDNN and MKL use: an
# AVX-512 CPU run with them set to AVX2 stands in for an AVX2 one (notes/mainjob.md).
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
# glibc's allocator settings, which scripts/main.sh sets: a step's time depends on them.
ALLOCATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def first_cpu_info() -> dict[str, str]:
    """The first processor's fields ("model name", "flags", ...); empty where there is no
    /proc/cpuinfo (another OS)."""
    try:
        with open("/proc/cpuinfo") as file:
            first_cpu = file.read().split("\n\n")[0]
    except OSError:
        return {}
    return dict(map(str.strip, line.split(":", 1)) for line in first_cpu.splitlines()
                if ":" in line)


def cpu_flags() -> set[str]:
    """The x86 feature flags; empty where none are listed (an Arm CPU lists "Features")."""
    return set(first_cpu_info().get("flags", "").split())


def backend_devices() -> list[str]:
    """The devices the Keras backend computes on (torch's backend has no keras.distribution)."""
    import keras

    if keras.backend.backend() == "torch":
        from torch import cuda

        return [f"cuda:{i}" for i in range(cuda.device_count())] or ["cpu:0"]
    return keras.distribution.list_devices()


def describe_host() -> dict:
    """The CPU, its cores and vector extensions, and memory: what needs no Keras backend."""
    cpu = first_cpu_info().get("model name") or platform.processor() or platform.machine()
    flags = cpu_flags()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "logical_cores": os.cpu_count(),
            "isa": [flag for flag in ISA_FLAGS if flag in flags],
            "memory_gib": round(memory, 1),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            **{name: os.environ[name] for name in (*ISA_CAPS, *ALLOCATOR_SETTINGS)
               if name in os.environ}}


def describe_machine() -> dict:
    """The host and the devices of the Keras backend this process runs."""
    return {**describe_host(), "devices": backend_devices()}


def machine_line(machine: dict) -> str:
    isa = ", ".join(machine["isa"]) or "none of " + ", ".join(ISA_FLAGS)
    line = (f"{machine['cpu']}, {machine['logical_cores']} logical cores ({isa}), "
            f"{machine['memory_gib']:.0f} GiB")
    for name in ("OMP_NUM_THREADS", *ISA_CAPS, *ALLOCATOR_SETTINGS):
        if machine.get(name):
            line += f", {name}={machine[name]}"
    if "devices" in machine:
        line += f", devices {', '.join(machine['devices'])}"
    return line
