"""The apps as a user meets them: --help, one-line errors with a non-zero exit, --debug, quiet
start-up, the installed console script and what pip installs. Argument and error handling do
not depend on the Keras backend, so the process-level tests run under TensorFlow only."""

import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vit_keras as vk
from apps.cli import APPS
from tests.conftest import TINY, backend_independent

ROOT = Path(__file__).parents[1]
pytestmark = backend_independent  # the apps' argument and error handling


def app(*argv, cwd=ROOT, command=None):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(ROOT)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the app sets its own
    return subprocess.run(command or [sys.executable, "-m", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def docstring(name: str) -> str:
    return ast.get_docstring(ast.parse((ROOT / "apps" / f"{name}.py").read_text()))


# Every app's --help through the vit-keras command, in one process, and the heavy modules that
# printing them imported.
HELPS = """
import contextlib, io, json, sys
from apps import cli
helps = {}
for name in cli.APPS:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        cli.main([name, "--help"])
    helps[name] = out.getvalue()
heavy = ("keras", "tensorflow", "torch", "jax")
print(json.dumps({"helps": helps, "imported": [m for m in heavy if m in sys.modules]}))
"""


@pytest.fixture(scope="module")
def helps():
    done = app(command=[sys.executable, "-c", HELPS])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_help_imports_neither_keras_nor_tensorflow(helps):
    assert helps["imported"] == []


# A flag's first line in --help ("  --epochs EPOCHS  passes ...", "  -h, --help", "  --remat"),
# not a group description's line that begins with a flag's name.
FLAG_LINE = re.compile(r"  -[-\w]+(,| [A-Z{(]| {2,}|$)")


def option_entries(text: str) -> list[str]:
    """Each flag of a --help text with its help, as one line."""
    entries = []
    for line in text.splitlines():
        if FLAG_LINE.match(line):
            entries.append(line.strip())
        elif entries and line.startswith(" " * 8) and line.strip():
            entries[-1] += " " + line.strip()
        elif not line.strip():
            entries.append("")
    return [entry for entry in entries if entry]


@pytest.mark.parametrize("name", list(APPS))
def test_help_prints_the_whole_purpose_and_every_flag_with_help(helps, name):
    text = helps["helps"][name]
    assert text.startswith(f"usage: vit-keras {name} ")
    last_line = docstring(name).strip().splitlines()[-1].strip()
    assert last_line in text  # the whole docstring, not its first line
    assert "python -m apps" not in text  # the examples use the installed command
    lines = text.splitlines()
    options = [i for i, line in enumerate(lines) if FLAG_LINE.match(line)]
    assert options
    for i in options:  # help follows the flag on its line, or on the next, indented further
        on_its_line = re.search(r"\S {2,}\S", lines[i].strip())
        below = i + 1 < len(lines) and lines[i + 1].startswith(" " * 8) and lines[i + 1].strip()
        assert on_its_line or below, lines[i]
    for entry in option_entries(text):  # a default is told once, and only if there is one
        assert entry.lower().count("default") <= 1, entry
        assert "(default: None)" not in entry and "(default: False)" not in entry, entry


def test_flag_defaults_are_shown(helps):
    text = " ".join(helps["helps"]["train"].split())
    assert "passes over the data (default 8 for the reference run, else 20)" in text  # --epochs
    assert "how the head reads the tokens (default: token)" in text  # --classifier


def test_python_m_names_the_module_in_its_usage():
    done = app("apps.variants", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m apps.variants")


@backend_independent
@pytest.mark.parametrize("number, words", [(1, "1 epoch"), (8, "8 epochs"), (0, "0 epochs"),
                                           (3744, "3,744 epochs")])
def test_the_apps_count_in_the_plural_unless_one(number, words):
    from apps.common import counted

    assert counted(number, "epoch") == words


def test_the_apps_choices_are_the_librarys():
    """apps.common spells the library's names so that a parser needs no Keras."""
    from apps import common
    from vit_keras import distribute, export, kernels, masked, training
    from vit_keras.export.formats import FORMATS
    from vit_keras.lora import TARGETS as LORA_TARGETS
    from vit_keras.models import CLASSIFIERS
    from vit_keras.position_embeddings import POSITION_EMBEDDINGS

    assert common.CLASSIFIERS == tuple(CLASSIFIERS)
    assert common.POSITION_EMBEDDINGS == tuple(POSITION_EMBEDDINGS)
    assert common.ATTENTION_KERNELS == tuple(kernels.ATTENTION_KERNELS)
    assert common.RECIPES == tuple(sorted(training.RECIPES))
    assert common.LORA_TARGETS == tuple(LORA_TARGETS)
    assert common.LABELS_FILE == export.LABELS_FILE
    assert common.DISTRIBUTIONS == tuple(distribute.KINDS)
    assert common.EXPORT_FORMATS == tuple(FORMATS)
    assert common.MASKED_TARGETS == tuple(masked.TARGETS)


def write_bad_files(tmp_path):
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    model = vk.vit(TINY, image_size=32, num_classes=2)
    model.save(tmp_path / "model.keras")
    data = (tmp_path / "model.keras").read_bytes()
    (tmp_path / "truncated.keras").write_bytes(data[:len(data) // 2])
    with zipfile.ZipFile(tmp_path / "notamodel.keras", "w") as archive:  # no config.json
        archive.writestr("notes.txt", "a zip, not a model")
    (tmp_path / "bad.onnx").write_text("junk")
    (tmp_path / "bad.tflite").write_text("junk")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    return tmp_path


MISTAKES = [
    (["apps.predict", "model.keras", "corrupt.png"], "cannot read image file"),
    (["apps.predict", "missing.keras", "corrupt.png"], "model 'missing.keras' does not exist"),
    (["apps.evaluate", "truncated.keras"], "is not a readable .keras file"),
    (["apps.predict", "truncated.keras", "corrupt.png"],
     "model file 'truncated.keras' is not a readable .keras file"),
    (["apps.predict", "notamodel.keras", "corrupt.png"],
     "model file 'notamodel.keras' could not be read: "),
    (["apps.predict", "bad.onnx", "corrupt.png"],
     "'bad.onnx' could not be read by onnxruntime: "),
    (["apps.predict", "bad.tflite", "corrupt.png"],
     "'bad.tflite' could not be read by LiteRT: "),
    (["apps.train", "--folder", "no_such_folder", "--epochs", "1"],
     "image folder 'no_such_folder' does not exist"),
    (["apps.export", "model.keras", "--out", "out", "--folder", "."],
     "'out' exists; pass --overwrite"),
    (["apps.inspect", "model.keras", "corrupt.png", "--out", "out"], "cannot read image file"),
    (["apps.train", "--epochs", "-3"], "expected a positive whole number, got '-3'"),
    (["apps.train", "--batch-size", "0"],
     "argument --batch-size: expected a positive whole number, got '0'"),
    (["apps.train", "--eval-every", "-1"], "expected a whole number of at least 0, got '-1'"),
    (["apps.train", "--resnet-layers", "0"], "expected 'none', 'stem' or positive whole numbers "
                                             "separated by commas (units per ResNet stage, e.g. "
                                             "3,4,9), got '0'"),
]


# Each case as `python -m APP ARGV` runs it (the module as __main__, its stderr captured), all
# in one process so that the interpreter and TensorFlow start once; the process's own stderr
# keeps what reaches file descriptor 2 directly, as TensorFlow's start-up lines would.
RUN_CASES = """
import contextlib, io, json, os, runpy, sys
results = []
for module, argv, cwd in json.loads(sys.argv[1]):
    os.chdir(cwd)
    sys.argv = [module, *argv]
    code, err = 0, io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            code = exit.code
    results.append({"code": code, "stderr": err.getvalue()})
print(json.dumps(results))
"""


def write_class_folder(tmp_path, classes):
    for label in classes:
        (tmp_path / "images" / label).mkdir(parents=True)
        Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "images" / label /
                                                              "0.png")


CASES = {
    **{message[:30]: (argv, message) for argv, message in MISTAKES},
    "debug": (["apps.evaluate", "truncated.keras", "--debug"], "is not a readable .keras file"),
    "three classes": (["apps.export", "model.keras", "--out", "new", "--folder", "images"],
                      "the data has 3 classes but the model has 2"),
    "no data": (["apps.export", "model.keras", "--out", "new"],
                "does not say what 'model.keras' was trained on; pass --dataset or --folder"),
}


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    """Each case's folder, exit status and stderr."""
    cases, folders = [], {}
    for name, (argv, _) in CASES.items():
        folder = write_bad_files(tmp_path_factory.mktemp("case"))
        if name == "three classes":
            write_class_folder(folder, ("a", "b", "c"))  # three classes for a two-class model
        cases.append((argv[0], argv[1:], str(folder)))
        folders[name] = folder
    done = app(command=[sys.executable, "-c", RUN_CASES, json.dumps(cases)])
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    return {"process_stderr": done.stderr,
            **{name: {**result, "folder": folders[name]}
               for name, result in zip(CASES, results, strict=True)}}


@pytest.mark.parametrize("argv, message", MISTAKES, ids=[m[1][:30] for m in MISTAKES])
def test_a_mistake_ends_with_one_clear_line_and_no_traceback(mistakes, argv, message):
    done = mistakes[message[:30]]
    assert done["code"] == 2, done
    assert message in done["stderr"]
    assert done["stderr"].count("\n") == 1, done["stderr"]  # one line: no usage block either
    assert "Traceback" not in done["stderr"]
    assert (done["folder"] / "out" / "keep.txt").read_text() == "mine"  # nothing overwritten
    assert not (done["folder"] / "runs").exists()  # nor a run folder begun


def test_tensorflow_starts_quietly_under_the_apps(mistakes):
    assert "cpu_feature_guard" not in mistakes["process_stderr"]
    assert "oneDNN" not in mistakes["process_stderr"]
    assert "Traceback" not in mistakes["process_stderr"]


def test_debug_shows_the_traceback(mistakes):
    done = mistakes["debug"]
    assert done["code"] == 2
    assert "Traceback" in done["stderr"] and "is not a readable .keras file" in done["stderr"]


def test_a_misspelt_backend_is_named_in_one_line():
    env = {**os.environ, "KERAS_BACKEND": "pytorch", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "apps.variants"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr == ("error: KERAS_BACKEND='pytorch': expected one of tensorflow, jax, "
                           "torch\n")


def test_an_apps_warning_is_one_line_unless_debug():
    """Python prints a warning with the source line that raised it, a line of library code."""
    code = ("import sys, warnings; from apps import common; "
            "common.run(lambda argv: warnings.warn('skipped 1 unreadable image file'), "
            "sys.argv[1:])")
    quiet = app(command=[sys.executable, "-c", code])
    debug = app(command=[sys.executable, "-c", code, "--debug"])
    assert quiet.stderr == "warning: skipped 1 unreadable image file\n"
    assert "UserWarning: skipped 1 unreadable image file" in debug.stderr


def test_verbose_brings_tensorflow_log_lines_back(tmp_path):
    quiet = app("apps.variants", "--pretrained")
    loud = app("apps.variants", "--pretrained", "--verbose")
    assert quiet.returncode == loud.returncode == 0
    assert len(loud.stderr) > len(quiet.stderr)


@pytest.mark.parametrize("name", ["three classes", "no data"])
def test_export_says_what_is_wrong_with_its_data(mistakes, name):
    assert mistakes[name]["code"] == 2
    assert CASES[name][1] in mistakes[name]["stderr"]


def test_console_script_runs_the_apps():
    script = Path(sys.executable).parent / "vit-keras"
    assert script.exists(), "pip install -e . makes the vit-keras console script"
    done = app(command=[str(script), "variants", "--help"], cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: vit-keras variants")
    listing = app(command=[str(script)], cwd="/")  # no app named: the list, as a usage error
    assert listing.returncode == 2 and "finetune" in listing.stderr and not listing.stdout
    asked = app(command=[str(script), "--help"], cwd="/")
    assert asked.returncode == 0 and asked.stdout.startswith("usage: vit-keras NAME")


def test_pip_installs_no_top_level_apps_package_and_ships_the_class_names(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    wheel = next(tmp_path.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert "vit_keras_apps" in top and "vit_keras" in top
    assert not top & {"apps", "benchmarks", "tests"}, top
    # the class names decode_predictions reads ship with the package
    assert {"vit_keras/weights/label_sets/imagenet1k.txt",
            "vit_keras/weights/label_sets/imagenet21k.txt"} <= set(names)


def test_install_page_tells_every_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    table = (ROOT / "docs" / "install.md").read_text().split("## Extras")[1].split("\n## ")[0]
    assert set(re.findall(r"^\| `([\w-]+)` \|", table, re.M)) == set(extras)


@pytest.mark.parametrize("app, flags, resnet_layers, patch_size, image_size", [
    ("train", [], (1,), 2, 32),  # the main job's hybrid
    ("train", ["--resnet-layers", "none"], None, 7, 28),  # its plain ViT
    ("train", ["--resnet-layers", "none", "--patch-size", "4"], None, 4, 28),
    ("train", ["--resnet-layers", "stem", "--resnet-width", "64"], (), 2, 32),
    ("train", ["--resnet-layers", "3,4,9"], (3, 4, 9), 2, 32),
    ("pretrain", [], None, 7, 28),  # masked patch prediction: patches of pixels
])
def test_resnet_flags_make_the_config(app, flags, resnet_layers, patch_size, image_size):
    from apps import common, pretrain, train

    if app == "pretrain":
        args = pretrain.build_parser().parse_args(flags)
        pretrain.fill_pretrain_defaults(args)
    else:
        args = train.build_parser().parse_args(flags)
        train.fill_defaults(args)
    config = common.model_config(args)
    assert (config.resnet_layers, config.patch_size, args.image_size) == (
        resnet_layers, patch_size, image_size)
    assert config.resnet_width == (64 if "64" in flags else 32)
