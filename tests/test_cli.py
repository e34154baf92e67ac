"""The apps as a user meets them: --help, one-line errors with a non-zero exit, --debug, quiet
start-up, the installed console script and what pip installs. Argument and error handling do
not depend on the Keras backend, so the process-level tests run under TensorFlow only."""

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

import vit_keras as vk
from apps.cli import APPS
from tests.conftest import TINY

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="the apps' argument and error handling are "
                                       "backend-independent; checked once, under TensorFlow")


def app(*argv, cwd=ROOT, command=None):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(ROOT)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the app sets its own
    return subprocess.run(command or [sys.executable, "-m", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def docstring(name: str) -> str:
    return ast.get_docstring(ast.parse((ROOT / "apps" / f"{name}.py").read_text()))


@pytest.mark.parametrize("name", list(APPS))
def test_help_prints_the_whole_purpose_and_every_flag_with_help(name):
    done = app(f"apps.{name}", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m apps.{name}")
    last_line = docstring(name).strip().splitlines()[-1].strip()
    assert last_line in done.stdout  # the whole docstring, not its first line
    lines = done.stdout.splitlines()
    options = [i for i, line in enumerate(lines) if line.startswith("  -")]
    assert options
    for i in options:  # help follows the flag on its line, or on the next, indented further
        on_its_line = re.search(r"\S {2,}\S", lines[i].strip())
        below = i + 1 < len(lines) and lines[i + 1].startswith(" " * 8) and lines[i + 1].strip()
        assert on_its_line or below, lines[i]
    assert "cpu_feature_guard" not in done.stderr and "oneDNN" not in done.stderr


def test_flag_defaults_are_shown():
    done = app("apps.train", "--help")
    assert "passes over the data (default: 20)" in " ".join(done.stdout.split())  # --epochs


def write_bad_files(tmp_path):
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    model = vk.vit(TINY, image_size=32, num_classes=2)
    model.save(tmp_path / "model.keras")
    data = (tmp_path / "model.keras").read_bytes()
    (tmp_path / "truncated.keras").write_bytes(data[:len(data) // 2])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    return tmp_path


MISTAKES = [
    (["apps.predict", "model.keras", "corrupt.png"], "cannot read image file"),
    (["apps.predict", "missing.keras", "corrupt.png"], "model 'missing.keras' does not exist"),
    (["apps.evaluate", "truncated.keras"], "is not a readable .keras file"),
    (["apps.train", "--folder", "no_such_folder", "--epochs", "1"],
     "image folder 'no_such_folder' does not exist"),
    (["apps.export", "model.keras", "--out", "out", "--folder", "."],
     "'out' exists; pass --overwrite"),
    (["apps.inspect", "model.keras", "corrupt.png", "--out", "out"], "cannot read image file"),
    (["apps.train", "--epochs", "-3"], "expected a positive whole number, got '-3'"),
    (["apps.train", "--eval-every", "-1"], "expected a whole number of at least 0, got '-1'"),
]


@pytest.mark.parametrize("argv, message", MISTAKES, ids=[m[1][:30] for m in MISTAKES])
def test_a_mistake_ends_with_one_clear_line_and_no_traceback(tmp_path, argv, message):
    done = app(*argv, cwd=write_bad_files(tmp_path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"  # nothing overwritten


def test_debug_shows_the_traceback(tmp_path):
    done = app("apps.evaluate", "truncated.keras", "--debug", cwd=write_bad_files(tmp_path))
    assert done.returncode == 2
    assert "Traceback" in done.stderr and "is not a readable .keras file" in done.stderr


def test_verbose_brings_tensorflow_log_lines_back(tmp_path):
    quiet = app("apps.variants", "--pretrained")
    loud = app("apps.variants", "--pretrained", "--verbose")
    assert quiet.returncode == loud.returncode == 0
    assert len(loud.stderr) > len(quiet.stderr)


def test_export_refuses_data_with_another_class_count(tmp_path):
    write_bad_files(tmp_path)
    for label in ("a", "b", "c"):  # three classes for a two-class model
        (tmp_path / "images" / label).mkdir(parents=True)
        Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "images" / label /
                                                              "0.png")
    done = app("apps.export", "model.keras", "--out", "new", "--folder", "images",
               cwd=tmp_path)
    assert done.returncode == 2
    assert "the data has 3 classes but the model has 2" in done.stderr


def test_export_without_data_says_what_to_pass(tmp_path):
    write_bad_files(tmp_path)
    done = app("apps.export", "model.keras", "--out", "new", cwd=tmp_path)
    assert done.returncode == 2
    assert "does not say what 'model.keras' was trained on; pass --dataset or --folder" in \
        done.stderr


def test_console_script_runs_the_apps():
    script = Path(sys.executable).parent / "vit-keras"
    assert script.exists(), "pip install -e . makes the vit-keras console script"
    done = app(command=[str(script), "variants", "--help"], cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: vit-keras variants")
    listing = app(command=[str(script)], cwd="/")
    assert listing.returncode == 2 and "finetune" in listing.stdout


def test_pip_installs_no_top_level_apps_package(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    wheel = next(tmp_path.glob("*.whl"))
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "vit_keras_apps" in top and "vit_keras" in top
    assert not top & {"apps", "benchmarks", "tests"}, top
