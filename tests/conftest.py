import csv
import gc
import http.server
import importlib.resources
import os
import re
import threading
from pathlib import Path

# Tests run one backend per process; .ci/run runs the suite once per backend.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Under pytest-xdist each worker gets its share of the cores (one each on the 2-core CI with
# -n 2), its child processes included: math threads spinning on a core the other worker holds
# (PyTorch's OpenMP threads most of all) slow a small model's training many times over.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")  # Linux
              else os.cpu_count() or 1)
    _share = str(max(1, _cores // _workers))
    os.environ.setdefault("OMP_NUM_THREADS", _share)
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", _share)

# torch (and timm, which loads torch._dynamo) must be imported before TensorFlow, or the
# process segfaults; Keras' TensorFlow backend imports TensorFlow.
import timm  # noqa: E402, F401, I001
import torch  # noqa: E402, F401

# isort: split
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest_plugins = ["pytester", "tests.budget"]

# For tests whose outcome cannot depend on the Keras backend (argument parsing, file formats,
# tf.data pipelines, the apps' and experiments' smoke runs, text checks): run once, in the
# PyTorch pass, where small models train eagerly, without tracing or compiling a graph first.
backend_independent = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="backend-independent: checked once, in the suite's PyTorch pass")
# For tests that need TensorFlow itself (export to SavedModel, TFLite and ONNX), or that run
# as a reader runs them under Keras' default backend (the docs' examples): run once, in the
# TensorFlow pass.
in_tensorflow_pass = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="checked once, in the suite's TensorFlow pass")

TINY = dict(hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, patch_size=8)
# The apps' flags for TINY as a plain ViT (without them the apps build the main job's hybrid).
TINY_FLAGS = [*(f"--{key.replace('_', '-')}={value}" for key, value in TINY.items()),
              "--resnet-layers=none"]


def pytest_report_header(config):
    return f"keras backend: {keras.backend.backend()}"


def randomize(model, seed=0, scale=0.2):
    """Gives every variable random values, so no zero-initialised part hides a bug."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, scale, variable.shape).astype("float32"))
    return model


def randomize_layer(layer, input_shape, seed=0, scale=0.2):
    """A built layer with random weights, as randomize does for models."""
    layer.build(input_shape)
    return randomize(layer, seed, scale)


def checkpoint_params(model):
    """The model's weights under the official checkpoint names (a test-side spec of the map)."""
    params = {}
    for variable in model.weights:
        name = variable.path.replace("Transformer_", "Transformer/", 1)
        name = name.replace("/gamma", "/scale").replace("/beta", "/bias")
        name = name.replace("_kernel", "/kernel").replace("_bias", "/bias")
        name = re.sub(r"^(block\d+)_(unit\d+)/", r"\1/\2/", name)
        name = "cls" if name == "cls/cls" else name
        params[name] = keras.ops.convert_to_numpy(variable.value)
    return params


def write_release_file(root, name: str, variant: str):
    """A random checkpoint in the layout of the named release's file, where the registry
    expects it under `root`: Google's .npz, or timm's safetensors made by timm itself.
    Returns the path and, for timm files, the timm model that wrote it."""
    from safetensors.torch import save_file

    import vit_keras as vk
    from vit_keras.weights import pretrained

    entry = pretrained.checkpoint(variant, name)
    path = root / entry.path
    path.parent.mkdir(parents=True, exist_ok=True)
    if entry.timm_model is None:
        vk.save_npz(vk.vit(variant, num_classes=entry.num_classes), path)
        return path, None
    reference = timm.create_model(entry.timm_model).eval()
    save_file(reference.state_dict(), path)
    return path, reference


def images(batch=2, height=32, width=32, seed=1):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (batch, height, width, 3)).astype("float32")


@pytest.fixture(autouse=True, scope="module")
def _long_lived_objects_out_of_the_collectors_way():
    """At each test module's start, before its own fixtures, moves what is alive (the
    frameworks and what they have loaded since, timm, the test modules) out of the garbage
    collector's reach, once the garbage of the modules before is collected: it lives as long
    as the process. The full collection that keras.backend.clear_session runs after every
    test then walks only what this module's tests made, instead of the frameworks' objects as
    well, a walk that cost more than many a test."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()


def claim_run(flags: list[str]) -> Path:
    """The run folder apps.train makes for flags (its arguments.json), as scripts/main.sh's
    run would; returns the folder."""
    from apps import train

    args = train.build_parser().parse_args(flags)
    train.fill_defaults(args)
    train.claim_run_dir(args, train.run_dir_of(args))
    return Path(train.run_dir_of(args))


@pytest.fixture
def weights_server(tmp_path, monkeypatch):
    """A loopback HTTP server over tmp_path/served, counting the requests it answers."""
    root = tmp_path / "served"
    root.mkdir()
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):  # noqa: N802
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("VIT_KERAS_WEIGHTS_URL", f"http://127.0.0.1:{server.server_port}/")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    yield root, requests
    server.shutdown()
    server.server_close()


def timm_data(file_name: str) -> str:
    return (importlib.resources.files("timm.data") / "_info" / file_name).read_text("utf-8")


def timm_classes(synset_file: str) -> list[tuple[str, str]]:
    """(synset, lemmas) per class as timm's files hold them, read here without timm's code."""
    lemmas = dict(csv.reader(timm_data("imagenet_synset_to_lemma.txt").splitlines(),
                             delimiter="\t"))
    return [(synset, lemmas[synset]) for synset in timm_data(synset_file).splitlines()]
