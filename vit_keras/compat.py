"""The one module that reads Keras' and PyTorch's private names. Keras may rename any of them
in a minor release; keeping them here makes that one file to check against a new version,
and every other module calls these functions by names that say what they do.

Nothing here imports Keras, TensorFlow or PyTorch: `vit_keras/__init__.py` imports this module
first, and importing it loads Triton's library (preload_triton) before Keras loads its backend.
"""

import contextlib
import importlib.util
import sys

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


# Keras layers and models


def flatten_layers(layer, include_self: bool = True) -> list:
    """Every layer inside `layer`, nested ones included (Keras' own walk)."""
    return list(layer._flatten_layers(include_self=include_self))


def base_kernel(layer):
    """A Dense or EinsumDense layer's kernel variable without its LoRA adapters (the layer's
    public `kernel` adds them)."""
    return layer._kernel


def inbound_nodes(layer) -> list:
    """The nodes at which `layer` is called, in any model."""
    return list(layer._inbound_nodes)


def own_node_ids(model) -> set[int]:
    """The ids of the nodes of a functional model's own graph."""
    return {id(node) for depth in model._nodes_by_depth.values() for node in depth}


def compile_config(model) -> dict | None:
    """The arguments model.compile received, as Keras serializes them into a .keras file;
    None for a model that was not compiled."""
    config = getattr(model, "_compile_config", None)
    return None if config is None else config.config


def symbolic_build(model, data_batch) -> None:
    """Builds a model's compiled metrics and optimizer from one batch, as fit does first."""
    model._symbolic_build(data_batch=data_batch)


def set_maybe_symbolic_build(model, build) -> None:
    """Replaces the model's first-batch build by build(iterator=None, data_batch=None)."""
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
    keras_update_variables for Keras' own."""

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
    device: False for a model that runs eagerly, as compile decides."""
    return not model.run_eagerly and bool(model._resolve_auto_jit_compile())
