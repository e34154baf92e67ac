"""The one module that reads Keras' and PyTorch's private names. Keras may rename any of them
in a minor release; keeping them here makes that one file to check against a new version,
and every other module calls these functions by names that say what they do.

Each group of names is a feature (FEATURES) with a check that the names exist and behave as
this module expects: feature detection, not a version pin. `check_at_import()`, run when
`vit_keras` is imported, tries the checks that start nothing of the backend (names defined on
classes and modules, layers constructed but never called), so that importing stays safe to
fork; the others run on first use. A fast path whose feature fails turns off with one
warning and the general path runs (vit_keras.kernels.uses); a feature that the library needs
for something else (layer-wise learning rates, LoRA) refuses with one clear error instead of
computing something else (require).

Nothing here imports Keras, TensorFlow or PyTorch at import: `vit_keras/__init__.py` imports
this module first, and importing it loads Triton's library (preload_triton) before Keras loads
its backend.
"""

import contextlib
import dataclasses
import functools
import importlib.metadata
import importlib.util
import sys
import warnings
from collections.abc import Callable

# The versions whose private names this module was last checked against, for the warning a
# failed check gives; other versions run wherever the checks pass.
TESTED_WITH = {"keras": "3.15.1", "torch": "2.14.1"}

# Keras' backend-specific optimizer classes (keras.optimizers.Adam becomes one on PyTorch)
# live under this private package.
_KERAS_BACKEND_MODULES = "keras.src.backend."


def preload_triton() -> None:
    """Loads Triton's native library if Triton is installed and TensorFlow is not loaded yet:
    Triton (torch.compile's compiler, loaded by `import timm` and torchvision through
    torch._dynamo) segfaults when its library loads after TensorFlow's."""
    if "tensorflow" not in sys.modules and importlib.util.find_spec("triton") is not None:
        with contextlib.suppress(ImportError):
            import triton._C.libtriton  # noqa: F401


preload_triton()


# Features: which names each needs, what needs them, and how they are checked


@dataclasses.dataclass(frozen=True)
class Feature:
    """A group of private names. names: as the warning lists them; used_by: what in
    vit_keras reads them; check: True where they exist and behave as expected; at_import:
    the check starts nothing of the backend (no tensor, no traced call), so
    check_at_import() runs it; backend: the one backend that
    reads the names, or None for all."""

    names: tuple[str, ...]
    used_by: str
    check: Callable[[], bool]
    at_import: bool = False
    backend: str | None = None


def _backend() -> str:
    import keras

    return keras.backend.backend()


def _has(owner, *names: str) -> bool:
    return all(hasattr(owner, name) for name in names)


def _check_layer_walk() -> bool:
    import keras

    outer = keras.layers.Layer()
    outer.inner = keras.layers.Identity()
    return [type(layer) for layer in outer._flatten_layers(include_self=False)] == [
        keras.layers.Identity]


def _check_graph_nodes() -> bool:
    import keras

    inputs = keras.Input((2,))
    layer = keras.layers.Identity()
    model = keras.Model(inputs, layer(inputs))
    own = {id(node) for depth in model._nodes_by_depth.values() for node in depth}
    return [id(node) in own for node in layer._inbound_nodes] == [True]


def _check_compile_config() -> bool:
    import keras

    model = keras.Sequential([keras.layers.Identity()])
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    config = model._compile_config.config
    return config["loss"] == "mse" and config["jit_compile"] is False


def _check_jit_compile_resolution() -> bool:
    import keras

    return _has(keras.Model, "_resolve_auto_jit_compile")


def _check_symbolic_build() -> bool:
    import keras

    return _has(keras.Model, "_symbolic_build", "_maybe_symbolic_build")


def _check_optimizer_hooks() -> bool:
    import keras

    return _has(keras.optimizers.Optimizer, "_get_current_learning_rate", "_apply_weight_decay",
                "_backend_update_step", "_use_weight_decay", "_get_variable_index")


def _check_adam_slots() -> bool:
    import keras

    variables = [keras.Variable([1.0]), keras.Variable([[2.0, 3.0]])]
    optimizer = keras.optimizers.Adam()
    optimizer.build(variables)
    index = optimizer._get_variable_index(variables[1])
    return (index == 1 and tuple(optimizer._momentums[index].shape) == (1, 2)
            and tuple(optimizer._velocities[index].shape) == (1, 2))


def _check_optimizer_replacements() -> bool:
    import keras

    return _has(keras_optimizer_class(keras.optimizers.Adam), "_clip_gradients",
                "_parallel_update_step")


def _check_torch_foreach() -> bool:
    import torch

    tensors = [torch.tensor([3.0, 4.0]), torch.tensor([1.0])]
    norms = torch._foreach_norm(tensors)
    doubled = torch._foreach_mul(tensors, torch.tensor(2.0))
    return ([float(n) for n in norms] == [5.0, 1.0]
            and [t.tolist() for t in doubled] == [[6.0, 8.0], [2.0]])


def _check_torch_fused_adam() -> bool:
    """One step of torch's fused Adam kernel against Adam's formula (Kingma and Ba)."""
    import torch

    value, grad = torch.tensor([1.0]), torch.tensor([0.5])
    m, v = torch.zeros(1), torch.zeros(1)
    torch._fused_adam_([value], [grad], [m], [v], [], [torch.tensor(1.0)], lr=0.1, beta1=0.9,
                       beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    m_hat, v_hat = 0.1 * 0.5 / (1 - 0.9), 0.001 * 0.25 / (1 - 0.999)
    expected = 1.0 - 0.1 * m_hat / (v_hat ** 0.5 + 1e-8)
    return abs(float(value[0]) - expected) < 1e-6 and abs(float(m[0]) - 0.05) < 1e-7


FEATURES = {
    "layer_walk": Feature(("keras.layers.Layer._flatten_layers",),
                          "LoRA and the weight loaders' walk over nested layers",
                          _check_layer_walk, at_import=True),
    "graph_nodes": Feature(("keras.layers.Layer._inbound_nodes",
                            "keras.Model._nodes_by_depth"),
                           "features() and the export's serving graph", _check_graph_nodes),
    "compile_config": Feature(("keras.Model._compile_config",),
                              "a .keras file's compile state (jit_compile 'auto', the public "
                              "optimizer class)", _check_compile_config),
    "jit_compile_resolution": Feature(("keras.Model._resolve_auto_jit_compile",),
                                      "compiling a loaded model with jit_compile 'auto'",
                                      _check_jit_compile_resolution, at_import=True),
    "symbolic_build": Feature(("keras.Model._symbolic_build", "keras.Model._maybe_symbolic_build"),
                              "the multi-worker build", _check_symbolic_build, at_import=True,
                              backend="tensorflow"),
    "optimizer_hooks": Feature(("Optimizer._get_current_learning_rate",
                                "Optimizer._apply_weight_decay", "Optimizer._backend_update_step",
                                "Optimizer._use_weight_decay", "Optimizer._get_variable_index"),
                               "layer-wise learning rates", _check_optimizer_hooks,
                               at_import=True),
    "optimizer_replacements": Feature(("Optimizer._clip_gradients",
                                       "Adam._parallel_update_step"),
                                      "the multi-tensor gradient clipping and fused Adam update",
                                      _check_optimizer_replacements, at_import=True,
                                      backend="torch"),
    "adam_slots": Feature(("Adam._momentums", "Adam._velocities"), "the fused Adam update",
                          _check_adam_slots, backend="torch"),
    "foreach": Feature(("torch._foreach_norm", "torch._foreach_mul"),
                       "the multi-tensor gradient clipping", _check_torch_foreach,
                       backend="torch"),
    "fused_adam": Feature(("torch._fused_adam_",), "the fused Adam update",
                          _check_torch_fused_adam, backend="torch"),
}


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _failure(name: str) -> str:
    feature = FEATURES[name]
    package = "torch" if feature.names[0].startswith("torch.") else "keras"
    return (f"{', '.join(feature.names)} missing or changed in {package} {_version(package)} "
            f"(checked with {TESTED_WITH[package]})")


@functools.cache
def supports(name: str) -> bool:
    """Whether feature `name`'s private names exist and behave as expected; checked once. A
    feature that fails warns once, naming what turns off.

    Args:
        name: a key of FEATURES.

    Returns:
        True where the check passes.
    """
    feature = FEATURES[name]
    try:
        passed = bool(feature.check())
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError, IndexError):
        passed = False
    if not passed:
        warnings.warn(f"vit_keras: {_failure(name)}: {feature.used_by} falls back to the "
                      "general path or refuses", RuntimeWarning, stacklevel=2)
    return passed


def require(name: str) -> None:
    """Raises where feature `name` fails its check, for what cannot fall back.

    Raises:
        RuntimeError: the feature's names are missing or changed.
    """
    if not supports(name):
        raise RuntimeError(f"{FEATURES[name].used_by} needs {_failure(name)}")


def check_at_import() -> None:
    """Runs the checks marked at_import (supports warns for each that fails), a backend's
    own only on that backend."""
    for name, feature in FEATURES.items():
        if feature.at_import and feature.backend in (None, _backend()):
            supports(name)


# Keras layers and models


def flatten_layers(layer, include_self: bool = True) -> list:
    """Every layer inside `layer`, nested ones included (Keras' own walk)."""
    require("layer_walk")
    return list(layer._flatten_layers(include_self=include_self))


def base_kernel(layer):
    """A Dense or EinsumDense layer's kernel variable without its LoRA adapters (the layer's
    public `kernel` adds them); the public one where Keras keeps no `_kernel` and the layer
    has no adapters.

    Raises:
        RuntimeError: a layer with LoRA adapters and no `_kernel`.
    """
    kernel = getattr(layer, "_kernel", None)
    if kernel is not None:
        return kernel
    if getattr(layer, "lora_enabled", False):
        raise RuntimeError(f"LoRA on {layer.name} needs keras.layers.Dense._kernel, missing "
                           f"in keras {_version('keras')} (checked with {TESTED_WITH['keras']})")
    return layer.kernel


def inbound_nodes(layer) -> list:
    """The nodes at which `layer` is called, in any model."""
    require("graph_nodes")
    return list(layer._inbound_nodes)


def own_node_ids(model) -> set[int]:
    """The ids of the nodes of a functional model's own graph."""
    require("graph_nodes")
    return {id(node) for depth in model._nodes_by_depth.values() for node in depth}


def compile_config(model) -> dict | None:
    """The arguments model.compile received, as Keras serializes them into a .keras file;
    None for a model that was not compiled (or, with a warning, where Keras keeps none)."""
    config = getattr(model, "_compile_config", None)
    if config is None and model.compiled:
        supports("compile_config")
    return None if config is None else config.config


def symbolic_build(model, data_batch) -> None:
    """Builds a model's compiled metrics and optimizer from one batch, as fit does first."""
    require("symbolic_build")
    model._symbolic_build(data_batch=data_batch)


def set_maybe_symbolic_build(model, build) -> None:
    """Replaces the model's first-batch build by build(iterator=None, data_batch=None)."""
    require("symbolic_build")
    model._maybe_symbolic_build = build


def is_backend_optimizer(optimizer) -> bool:
    """Whether `optimizer` is one of the backend-specific classes Keras swaps in for its own
    (a torch Adam for keras.optimizers.Adam)."""
    return type(optimizer).__module__.startswith(_KERAS_BACKEND_MODULES)


def without_call_info(error: Exception) -> Exception:
    """`error` marked as already described, so that Keras adds no dump of the layer call's
    arguments around it."""
    error._keras_call_info_injected = True
    return error


# Keras optimizers


def variable_index(optimizer, variable) -> int:
    """The index of `variable` in the optimizer's slot lists."""
    return optimizer._get_variable_index(variable)


def adam_slots(optimizer, index: int) -> tuple:
    """An Adam optimizer's first and second moment variables of the variable at `index`."""
    return optimizer._momentums[index], optimizer._velocities[index]


def keras_optimizer_class(cls):
    """The class Keras builds for optimizer class `cls` on this backend: on PyTorch its own
    multi-tensor version of Adam, AdamW, SGD and others, elsewhere `cls`. Its __new__ picks
    the class without making the optimizer's variables."""
    return type(cls.__new__(cls))


def keras_clip_gradients(optimizer):
    """Keras' gradient clipping of `optimizer`'s class, as a function of (optimizer, grads)."""
    return type(optimizer)._clip_gradients


def set_clip_gradients(optimizer, clip) -> None:
    """Replaces the optimizer's gradient clipping by clip(grads) -> grads."""
    optimizer._clip_gradients = clip


def keras_parallel_update(optimizer):
    """Keras' update of many variables at once for `optimizer`'s class, as a function of
    (optimizer, grads, variables, learning_rate); None where the class has none."""
    return getattr(type(optimizer), "_parallel_update_step", None)


def set_parallel_update(optimizer, update) -> None:
    """Replaces the optimizer's update of many variables by update(grads, variables, rate)."""
    optimizer._parallel_update_step = update


class OptimizerHooks:
    """A mixin for a Keras optimizer class that exposes the steps of Keras' update under
    public names: rate_scale() scales the learning rate Keras reads (its weight decay reads
    it too); weight_decay_step(variables) and update_variables(grads, variables, rate) replace
    Keras' weight decay and backend update, and call keras_weight_decay_step and
    keras_update_variables for Keras' own. Constructing one refuses a Keras whose hooks
    fail their check (require), where the overrides would go uncalled."""

    def __init__(self, *args, **kwargs):
        require("optimizer_hooks")
        super().__init__(*args, **kwargs)

    def rate_scale(self) -> float:
        return 1.0

    def weight_decay_step(self, variables) -> None:
        self.keras_weight_decay_step(variables)

    def update_variables(self, grads, variables, learning_rate) -> None:
        self.keras_update_variables(grads, variables, learning_rate)

    def keras_weight_decay_step(self, variables) -> None:
        super()._apply_weight_decay(variables)

    def keras_update_variables(self, grads, variables, learning_rate) -> None:
        super()._backend_update_step(grads, variables, learning_rate)

    def uses_weight_decay(self, variable) -> bool:
        """Whether Keras' weight decay applies to `variable`."""
        return self._use_weight_decay(variable)

    def _get_current_learning_rate(self):
        rate = super()._get_current_learning_rate()
        scale = self.rate_scale()
        return rate if scale == 1 else rate * scale

    def _apply_weight_decay(self, variables):
        self.weight_decay_step(variables)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        self.update_variables(grads, trainable_variables, learning_rate)


# PyTorch


def foreach_norm(tensors) -> list:
    """Each tensor's 2-norm, in one multi-tensor call."""
    import torch

    return torch._foreach_norm(tensors)


def foreach_mul(tensors, scale) -> list:
    """Each tensor times `scale`, in one multi-tensor call."""
    import torch

    return torch._foreach_mul(tensors, scale)


def fused_adam_(*args, **kwargs) -> None:
    """torch's fused Adam kernel, which updates its parameters and slots in place."""
    import torch

    torch._fused_adam_(*args, **kwargs)


# Keras' jit_compile in a .keras file's compile state


def set_saved_jit_compile(model, value) -> None:
    """Sets the jit_compile that model.save writes into a .keras file's compile config (Keras
    records the value compile resolved "auto" to), leaving the one the compiled model runs
    with; nothing for a model that was not compiled."""
    config = compile_config(model)
    if config is not None:
        config["jit_compile"] = value


def auto_jit_compile(model) -> bool:
    """What model.compile(jit_compile="auto") resolves to for `model` on this backend and
    device: False for a model that runs eagerly, as compile decides, and where Keras' rule
    fails its check (eager is slower, never wrong)."""
    if model.run_eagerly or not supports("jit_compile_resolution"):
        return False
    return bool(model._resolve_auto_jit_compile())
