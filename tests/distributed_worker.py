"""Run in a child process by test_distribute.py: python -m tests.distributed_worker MODE OUT.

Each mode trains the same tiny model on the same data with and without a distribution and
writes the final weights to OUT (.npz); devices must be configured before the framework starts,
hence a process of its own.
"""

import os
import sys

MODE, OUT = sys.argv[1], sys.argv[2]
if MODE.startswith("jax"):
    os.environ["KERAS_BACKEND"] = "jax"
    if MODE != "jax-multiprocess":  # there: one CPU device in each of two processes
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
else:
    os.environ["KERAS_BACKEND"] = "tensorflow"

import dataclasses  # noqa: E402

import keras  # noqa: E402

keras.config.disable_traceback_filtering()
import numpy as np  # noqa: E402

import vit_keras as vk  # noqa: E402
from vit_keras import distribute, training  # noqa: E402

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, patch_size=8)
# JAX: Keras' "auto", the compiled step that fit runs for a JAX user and apps.train by
# default (eagerly, each op of a sharded step compiles on its own, which costs more).
JIT_COMPILE = "auto" if MODE.startswith("jax") else False
RECIPE = training.Recipe("sgd", 0.1, "linear", 0, momentum=0.0, clipnorm=None)
# With a teacher: DeiT's hard distillation into a distillation token's head.
DISTILLED = dataclasses.replace(RECIPE, distillation="hard", distillation_token=True)


def problem():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (32, 32, 32, 3)).astype("float32")
    y = np.eye(3, dtype="float32")[rng.integers(0, 3, 32)]
    return x, y


def seeded(model, first_seed=0):
    model.set_weights([np.random.default_rng(first_seed + i).normal(0, 0.1, w.shape)
                       .astype("float32") for i, w in enumerate(model.get_weights())])
    return model


def train(distribution, workaround=True, shard=None, distilled=False):
    """shard=(index, count): this process feeds its part of every global batch of 8;
    distilled: the student of a distillation token, taught by a fixed teacher."""
    keras.utils.set_random_seed(0)
    x, y = problem()
    batch = 8
    if shard:
        index, count = shard
        batch //= count
        x, y = (a.reshape(4, count, batch, *a.shape[1:])[:, index].reshape(-1, *a.shape[1:])
                for a in (x, y))
    with distribution.scope():
        model = seeded(vk.vit(TINY, image_size=32, num_classes=3, distilled=distilled))
        if distilled:
            teacher = seeded(vk.vit(TINY, image_size=32, num_classes=3), first_seed=100)
            fitted = training.compile_distiller(model, DISTILLED, 10**9, teacher=teacher,
                                                jit_compile=JIT_COMPILE)
        else:
            fitted = training.compile_model(model, RECIPE, total_steps=10**9,
                                            jit_compile=JIT_COMPILE)
    if workaround:
        distribute.prepare_model(fitted, distribution)
    fitted.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)  # 4 steps of 8
    return model


def save(models):
    arrays = {f"{name}_{i}": w for name, model in models.items()
              for i, w in enumerate(model.get_weights())}
    np.savez(OUT, **arrays)


if MODE == "mirrored":
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    mirrored = distribute.Distribution("mirrored", 2, strategy)
    save({"single": train(distribute.choose("none")), "distributed": train(mirrored),
          "distilled_single": train(distribute.choose("none"), distilled=True),
          "distilled_distributed": train(mirrored, distilled=True)})
elif MODE == "jax-data-parallel":
    dp = distribute.choose("data-parallel")
    assert dp.num_replicas == 4, dp
    distributed, distilled = train(dp), train(dp, distilled=True)
    keras.distribution.set_distribution(None)
    save({"single": train(distribute.choose("none")), "distributed": distributed,
          "distilled_single": train(distribute.choose("none"), distilled=True),
          "distilled_distributed": distilled})
elif MODE == "jax-model-parallel":
    mp = distribute.choose("model-parallel", model_axis=2)
    model = train(mp)
    block = "Transformer_encoderblock_0/"  # each of the first block's weights, by its path
    specs = {v.path.removeprefix(block): tuple(v.value.sharding.spec) for v in model.weights
             if v.path.startswith(block)}
    keras.distribution.set_distribution(None)
    save({"single": train(distribute.choose("none")), "distributed": model})
    with open(OUT.replace(".npz", ".txt"), "w") as file:
        file.write(repr({"specs": specs, "replicas": mp.num_replicas}))
elif MODE == "jax-multiprocess":  # JAX_COORDINATOR_ADDRESS etc. come from the parent
    dp = distribute.choose("data-parallel")
    dp.strategy.auto_shard_dataset = False  # each process feeds its own rows (below)
    process = int(os.environ["JAX_PROCESS_ID"])
    model = train(dp, shard=(process, int(os.environ["JAX_NUM_PROCESSES"])))
    assert dp.num_replicas == 2, dp
    save({"worker": model})
elif MODE in ("multiworker", "multiworker-without-workaround"):  # TF_CONFIG from the parent
    model = train(distribute.choose("multiworker"), workaround=MODE == "multiworker")
    save({"worker": model})
else:
    raise SystemExit(f"unknown mode {MODE}")
