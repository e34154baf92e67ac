"""Distribution tests: each runs its workers in child processes (devices must be set before
the framework starts), on loopback only, bounded in time and killed on failure."""

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from vit_keras import distribute

ROOT = Path(__file__).parents[1]
BACKEND = keras.backend.backend()


def run_workers(mode, outs, tf_configs=None, timeout=240, jax_coordinator=None):
    processes = []
    try:
        for i, out in enumerate(outs):
            env = {**os.environ}
            if tf_configs:
                env["TF_CONFIG"] = json.dumps(tf_configs[i])
            if jax_coordinator:
                env.update(JAX_COORDINATOR_ADDRESS=jax_coordinator,
                           JAX_NUM_PROCESSES=str(len(outs)), JAX_PROCESS_ID=str(i))
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "tests.distributed_worker", mode, str(out)], cwd=ROOT,
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = [p.communicate(timeout=timeout) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, err) for p, (_, err) in zip(processes, results, strict=True)]


def assert_same_training(path, run=""):
    """run "distilled_": the student trained with a teacher (tests.distributed_worker)."""
    weights = np.load(path)
    count = len([k for k in weights if k.startswith(f"{run}single_")])
    initial = [np.random.default_rng(i).normal(0, 0.1, weights[f"{run}single_{i}"].shape)
               for i in range(count)]
    for i in range(count):
        np.testing.assert_allclose(weights[f"{run}distributed_{i}"], weights[f"{run}single_{i}"],
                                   atol=1e-5)
    assert any(not np.allclose(weights[f"{run}single_{i}"], initial[i]) for i in range(count))


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow",
                                     reason="TensorFlow strategies: run in the tensorflow pass")
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution: run in the jax pass")


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """The weights after training over two logical CPUs and on one, from one worker (shared:
    the multiworker test compares itself with the same one-device run)."""
    out = tmp_path_factory.mktemp("mirrored") / "w.npz"
    [(code, err)] = run_workers("mirrored", [out])
    assert code == 0, err[-3000:]
    return out


@tensorflow_only
@pytest.mark.parametrize("run", ["", "distilled_"])
def test_mirrored_over_two_cpus_equals_one_device(mirrored, run):
    assert_same_training(mirrored, run)


def multiworker_configs():
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return [{"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(2)]


@tensorflow_only
def test_two_multiworker_processes_end_with_identical_weights(tmp_path, mirrored):
    outs = [tmp_path / "w0.npz", tmp_path / "w1.npz"]
    results = run_workers("multiworker", outs, multiworker_configs())
    for code, err in results:
        assert code == 0, err[-3000:]
    first, second = np.load(outs[0]), np.load(outs[1])
    for key in first.files:
        np.testing.assert_array_equal(first[key], second[key])
    single = np.load(mirrored)
    for i in range(len(first.files)):  # the same global batch as one device
        np.testing.assert_allclose(first[f"worker_{i}"], single[f"single_{i}"], atol=1e-5)


@tensorflow_only
def test_keras_still_needs_the_multiworker_workaround(tmp_path):
    """Fails once Keras fixes MultiWorkerMirroredStrategy + fit: then drop
    distribute.prepare_model's workaround."""
    outs = [tmp_path / "w0.npz", tmp_path / "w1.npz"]
    results = run_workers("multiworker-without-workaround", outs, multiworker_configs())
    assert all(code != 0 for code, _ in results)
    assert any("PerReplica" in err for _, err in results)


@pytest.fixture(scope="module")
def jax_data_parallel(tmp_path_factory):
    """The weights after training over four simulated devices and on one, from one worker
    (shared: the two-process test compares itself with the same one-device run)."""
    out = tmp_path_factory.mktemp("jax_data_parallel") / "w.npz"
    [(code, err)] = run_workers("jax-data-parallel", [out])
    assert code == 0, err[-3000:]
    return out


@jax_only
@pytest.mark.parametrize("run", ["", "distilled_"])
def test_jax_data_parallel_over_four_devices_equals_one(jax_data_parallel, run):
    assert_same_training(jax_data_parallel, run)


@jax_only
def test_two_jax_processes_train_together_like_one_device(tmp_path, jax_data_parallel):
    outs = [tmp_path / "w0.npz", tmp_path / "w1.npz"]
    results = run_workers("jax-multiprocess", outs,
                          jax_coordinator=f"127.0.0.1:{free_ports(1)[0]}")
    for code, err in results:
        assert code == 0, err[-3000:]
    first, second = np.load(outs[0]), np.load(outs[1])
    single = np.load(jax_data_parallel)
    for i in range(len(first.files)):
        np.testing.assert_array_equal(first[f"worker_{i}"], second[f"worker_{i}"])
        np.testing.assert_allclose(first[f"worker_{i}"], single[f"single_{i}"], atol=1e-5)


@jax_only
def test_jax_model_parallel_shards_heads_and_mlp_and_trains_like_one_device(tmp_path):
    [(code, err)] = run_workers("jax-model-parallel", [tmp_path / "w.npz"])
    assert code == 0, err[-3000:]
    written = ast.literal_eval((tmp_path / "w.txt").read_text())
    assert written["replicas"] == 2
    attention, mlp = "MultiHeadDotProductAttention_1/", "MlpBlock_3/"
    split = {**{f"{attention}{name}/kernel": (None, "model", None)  # heads
                for name in ("query", "key", "value")},
             **{f"{attention}{name}/bias": ("model", None) for name in ("query", "key", "value")},
             f"{attention}out/kernel": ("model", None, None),
             f"{mlp}Dense_0/kernel": (None, "model"), f"{mlp}Dense_0/bias": ("model",),
             f"{mlp}Dense_1/kernel": ("model", None)}  # hidden units
    replicated = [f"{attention}out/bias", f"{mlp}Dense_1/bias",
                  *(f"LayerNorm_{i}/{name}" for i in (0, 2) for name in ("gamma", "beta"))]
    assert written["specs"] == {**split, **{path: (None,) for path in replicated}}
    assert_same_training(tmp_path / "w.npz")


def test_choose_names_what_each_backend_supports():
    with pytest.raises(ValueError, match="unknown distribution 'horovod'"):
        distribute.choose("horovod")
    assert distribute.choose("none").num_replicas == 1
    expected = {"tensorflow": "is not for TensorFlow", "jax": "is not for JAX",
                "torch": "not supported on the torch backend"}[BACKEND]
    wrong = "data-parallel" if BACKEND == "tensorflow" else "mirrored"
    with pytest.raises(ValueError, match=expected):
        distribute.choose(wrong)


def test_scope_is_called_as_a_strategys_is():
    # A property before: `with distribution.scope():` raised "'nullcontext' object is not
    # callable".
    distribution = distribute.choose("none")
    for _ in range(2):  # a fresh context each time
        with distribution.scope():
            pass


@tensorflow_only
def test_a_strategy_scope_can_be_entered_for_building_and_again_for_training():
    """apps.train builds the model in the distribution's scope and training.train compiles in
    it again: each use gets a fresh scope of the same strategy."""
    import tensorflow as tf

    distribution = distribute.choose("mirrored")
    for _ in range(2):
        with distribution.scope():
            assert tf.distribute.get_strategy() is distribution.strategy
