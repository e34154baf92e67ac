"""The device a benchmark measures on, as the Keras backend sees it: its kind and name, inputs
placed on it, waiting for it (a GPU runs asynchronously: a call is timed to its result), and
its peak memory where the device reports one."""

import keras

from benchmarks.machine import backend_devices, describe_host

# --device's names for an accelerator: PyTorch says cuda where JAX and TensorFlow say gpu.
ACCELERATORS = ("cuda", "gpu", "tpu")


def device_kind() -> str:
    """The kind of the backend's first device: "cpu", "cuda" (PyTorch), "gpu" or "tpu"."""
    return backend_devices()[0].split(":")[0].lower()


def check_device(device: str | None) -> str:
    """--device, which must be what the backend computes on (its default when None): the
    backend's own settings choose it (CUDA_VISIBLE_DEVICES, JAX_PLATFORMS)."""
    seen = device_kind()
    if device is not None and device.lower() != seen:
        raise SystemExit(f"--device {device}: the {keras.backend.backend()} backend computes "
                         f"on {seen} ({', '.join(backend_devices())}); choose the device with "
                         "the backend's settings (CUDA_VISIBLE_DEVICES, JAX_PLATFORMS)")
    return seen


def torch_device() -> str:
    """Where the torch peers run: on the GPU when the backend computes on one, else the CPU."""
    import torch

    return "cuda" if device_kind() in ACCELERATORS and torch.cuda.is_available() else "cpu"


def device_name() -> str:
    """The accelerator's model name, or the CPU's."""
    if device_kind() in ACCELERATORS:
        if keras.backend.backend() == "jax":
            import jax

            return jax.devices()[0].device_kind
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
        return backend_devices()[0]
    return describe_host()["cpu"]


def on_device(array):
    """A NumPy array as a tensor on the backend's device."""
    return keras.ops.convert_to_tensor(array)


def synchronize(device: str) -> None:
    """Waits for torch's work on `device` to finish (nothing to wait for on a CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def reset_peak_memory(framework: str) -> None:
    """Starts a new peak where the device allows it (PyTorch's and TensorFlow's GPUs; JAX's
    peak is the process's so far)."""
    if framework == "torch" or keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available() and torch_device() == "cuda":
            torch.cuda.reset_peak_memory_stats()
    elif keras.backend.backend() == "tensorflow" and device_kind() == "gpu":
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("GPU:0")


def peak_memory_mib(framework: str) -> float | None:
    """The device's peak memory in MiB since the last reset, for torch (timm) or the Keras
    backend; None on a CPU, which reports none (--memory measures a process's peak there)."""
    if device_kind() not in ACCELERATORS:
        return None
    if framework == "torch" or keras.backend.backend() == "torch":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    if keras.backend.backend() == "jax":
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        peak = stats.get("peak_bytes_in_use")
        return None if peak is None else peak / 2**20
    import tensorflow as tf

    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
