"""Picks the distribution for the backend and hardware, using what TensorFlow and Keras
provide (no distribution layer of our own).

TensorFlow: TPUStrategy, MirroredStrategy, MultiWorkerMirroredStrategy (enter `.scope()`
around building and compiling the model, as a strategy's). JAX: keras.distribution
DataParallel over every device (multi-host after jax.distributed.initialize) or
ModelParallel, which shards the attention heads and the MLP's hidden units over a "model"
axis. PyTorch: one process only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import keras

from vit_keras import compat

__all__ = ["KINDS", "Distribution", "choose", "prepare_model", "vit_layout_map"]

KINDS = ("auto", "none", "tpu", "mirrored", "multiworker", "data-parallel", "model-parallel")
"""The distributions choose() takes: TensorFlow's strategies (tpu, mirrored, multiworker),
Keras' JAX distributions (data-parallel, model-parallel), none, and auto."""


TENSORFLOW_KINDS = ("tpu", "mirrored", "multiworker")


@dataclasses.dataclass
class Distribution:
    """The distribution choose() set up: what the training loop needs to know of it, the same
    on every backend.

    Args:
        kind: one of KINDS but "auto": what was chosen.
        num_replicas: the replicas the global batch is split over.
        strategy: the tf.distribute strategy, or the keras.distribution object (JAX); None
            for one device.
    """

    kind: str
    num_replicas: int  # the global batch is split over these
    strategy: object = None  # the tf.distribute strategy, or the keras.distribution object

    def scope(self) -> contextlib.AbstractContextManager:
        """A fresh context to build and compile the model in, each time it is called (a
        strategy's scope object can be entered once), used as a strategy's: `with
        distribution.scope():`. The TensorFlow strategy's scope; none for JAX, whose
        distribution is set globally, and for one device.

        Returns:
            The context manager.
        """
        if self.kind in TENSORFLOW_KINDS:
            return self.strategy.scope()
        return contextlib.nullcontext()

    def global_batch(self, per_replica_batch: int) -> int:
        """The batch of one step over all replicas.

        Args:
            per_replica_batch: the batch each replica takes.

        Returns:
            per_replica_batch times num_replicas.
        """
        return per_replica_batch * self.num_replicas


def vit_layout_map(mesh) -> keras.distribution.LayoutMap:
    """Megatron-style sharding of a ViT over the mesh's "model" axis: attention heads and
    the MLP's hidden units are split, so that each device holds a share of every block;
    everything else is replicated.

    Args:
        mesh: a keras.distribution.DeviceMesh with a "model" axis.

    Returns:
        The keras.distribution.LayoutMap, for keras.distribution.ModelParallel.
    """
    layout = keras.distribution.LayoutMap(mesh)
    layout[r".*MultiHeadDotProductAttention_1/(query|key|value)/kernel"] = (None, "model", None)
    layout[r".*MultiHeadDotProductAttention_1/(query|key|value)/bias"] = ("model", None)
    layout[r".*MultiHeadDotProductAttention_1/out/kernel"] = ("model", None, None)
    layout[r".*MlpBlock_3/Dense_0/kernel"] = (None, "model")
    layout[r".*MlpBlock_3/Dense_0/bias"] = ("model",)
    layout[r".*MlpBlock_3/Dense_1/kernel"] = ("model", None)
    return layout


def _auto(backend: str, tpu: str | None) -> str:
    if backend == "tensorflow":
        import tensorflow as tf

        if tpu or os.environ.get("TPU_NAME"):
            return "tpu"
        if os.environ.get("TF_CONFIG"):
            return "multiworker"
        return "mirrored" if len(tf.config.list_logical_devices("GPU")) > 1 else "none"
    if backend == "jax":
        import jax

        return "data-parallel" if jax.device_count() > 1 else "none"
    return "none"


def _tensorflow(kind: str, tpu: str | None) -> Distribution:
    import tensorflow as tf

    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    elif kind == "mirrored":
        strategy = tf.distribute.MirroredStrategy()
    elif kind == "multiworker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        raise ValueError(f"distribution {kind!r} is not for TensorFlow: expected tpu, "
                         "mirrored, multiworker or none")
    return Distribution(kind, strategy.num_replicas_in_sync, strategy)


def _jax(kind: str, model_axis: int) -> Distribution:
    import jax

    if os.environ.get("JAX_COORDINATOR_ADDRESS") and not jax.distributed.is_initialized():
        # Several processes: CPU devices talk through gloo (accelerators use their own links).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"],
                                   int(os.environ["JAX_NUM_PROCESSES"]),
                                   int(os.environ["JAX_PROCESS_ID"]))
    devices = keras.distribution.list_devices()
    if kind == "data-parallel":
        distribution = keras.distribution.DataParallel(devices=devices)
        replicas = len(devices)
    elif kind == "model-parallel":
        if len(devices) % model_axis:
            raise ValueError(f"model-parallel: {len(devices)} devices do not split into a "
                             f"model axis of {model_axis}")
        mesh = keras.distribution.DeviceMesh((len(devices) // model_axis, model_axis),
                                             ["data", "model"], devices)
        distribution = keras.distribution.ModelParallel(layout_map=vit_layout_map(mesh),
                                                        batch_dim_name="data")
        replicas = len(devices) // model_axis
    else:
        raise ValueError(f"distribution {kind!r} is not for JAX: expected data-parallel, "
                         "model-parallel or none")
    keras.distribution.set_distribution(distribution)
    return Distribution(kind, replicas, distribution)


def choose(kind: str = "auto", tpu: str | None = None, model_axis: int = 2) -> Distribution:
    """Sets up the distribution for the current Keras backend with what TensorFlow and Keras
    provide. On TensorFlow, build and compile the model inside the result's scope(); on JAX
    the distribution is set globally (keras.distribution.set_distribution).

    Args:
        kind: one of KINDS. "auto" picks what the hardware has: a TPU (tpu or TPU_NAME), several
            workers (TF_CONFIG), several GPUs, or every JAX device; else "none". "tpu",
            "mirrored" and "multiworker" are TensorFlow's strategies; "data-parallel" and
            "model-parallel" JAX's.
        tpu: the TPU's name or address, for "tpu".
        model_axis: the devices each model is sharded over, for "model-parallel".

    Returns:
        The Distribution.

    Raises:
        ValueError: an unknown kind, a kind for another backend (PyTorch trains on one
            process), or devices that do not split into model_axis.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown distribution {kind!r}: expected one of {', '.join(KINDS)}")
    backend = keras.backend.backend()
    if kind == "auto":
        kind = _auto(backend, tpu)
    if kind == "none":
        return Distribution("none", 1)
    if backend == "tensorflow":
        return _tensorflow(kind, tpu)
    if backend == "jax":
        return _jax(kind, model_axis)
    raise ValueError(f"distribution {kind!r} is not supported on the {backend} backend: "
                     "vit_keras trains on one PyTorch process (use the TensorFlow or JAX "
                     "backend to scale out)")


def prepare_model(model: keras.Model, distribution: Distribution) -> keras.Model:
    """Applies the workarounds a distribution needs; call it after compile, before fit.
    training.train calls it itself.

    MultiWorkerMirroredStrategy, two failures of Keras 3.15's TensorFlow trainer:
    1. it builds the model from its first batch by `strategy.reduce("MEAN", batch)`, which
       this strategy cannot do for eager per-replica inputs ("Attempt to convert a value
       (PerReplica...)"); the build needs only shapes and dtypes, so it gets this worker's
       first local replica's batch instead;
    2. it averages the step's logs over replicas with `reduce("MEAN", axis=0)`, which fails
       on 0-d values ("Invalid reduction dimension 0"); the logs leave each replica as
       1-element vectors, and that same reduce averages them to the scalars Keras expects.
    Gradients are all-reduced by the strategy as before: training itself is unchanged.

    Args:
        model: the compiled model.
        distribution: what choose() returned.

    Returns:
        The same model, patched for "multiworker" and unchanged for any other kind.
    """
    if distribution.kind != "multiworker":
        return model
    import tensorflow as tf
    from keras import tree

    strategy = distribution.strategy

    def local_batch(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tree.map_structure(local_batch, next(batches))
                break
        with strategy.scope():
            compat.symbolic_build(model, data_batch)

    def vector_logs(step):
        def wrapped(data):
            return tree.map_structure(
                lambda v: tf.reshape(v, [1]) if v.shape.rank == 0 else v, step(data))
        return wrapped

    compat.set_maybe_symbolic_build(model, maybe_symbolic_build)
    model.train_step = vector_logs(model.train_step)
    model.test_step = vector_logs(model.test_step)
    return model
