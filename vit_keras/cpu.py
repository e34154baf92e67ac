"""The CPU as Linux describes it in /proc/cpuinfo: TensorFlow's XLA default depends on its
features (training.xla_pays_off_on_tensorflow_cpu) and the benchmark records them."""

from __future__ import annotations

import functools


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


def cpu_has_avx512() -> bool:
    """Whether an x86 CPU has AVX-512. Where no x86 flags can be read (another OS, an Arm CPU:
    untimed) it is assumed, which keeps the XLA width limits."""
    flags = cpu_flags()
    return not flags or "avx512f" in flags
