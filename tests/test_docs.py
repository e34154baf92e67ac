"""Every example in README.md and docs/*.md runs as written: each page's Python blocks and
shell commands, in order, each in a fresh process, in one scratch folder per page. A Python
block's process is forked from one that has imported vit_keras and TensorFlow already, so
that each block does not pay for those imports again; so is each command of a shell block made
only of `vit-keras` commands, run as the console script runs it. A block with environment
markers, one that sets os.environ itself, or a shell block with any other syntax starts a new
interpreter instead.

Markers, HTML comments on the lines just before a block, adapt a block for the test:
    <!-- test: replace OLD => NEW -->   a test-only substitution (a smaller variant, fewer
                                        epochs); OLD must occur in the block
    <!-- test: ENV=VALUE -->            an environment variable for this block
    <!-- test: serve pretrained NAME VARIANT -->
                                        pre-trained names download from a loopback server
                                        that holds a random checkpoint of NAME for VARIANT,
                                        in the layout of its release's file, into an empty
                                        Keras cache of the block's own
    <!-- not run: REASON -->            the block is shown but not run, for the reason given
A shell block's lines run with bash; lines of a shell block are commands a reader types.
Each page's folder holds photo.jpg (tests/data/), the image the pretrained examples read.
"""

import dataclasses
import functools
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import in_tensorflow_pass, write_release_file

ROOT = Path(__file__).parents[1]
PHOTO = Path(__file__).parent / "data" / "photo.jpg"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"((?:<!-- (?:test|not run): [^\n]*? -->\n)*)```(\w+)\n(.*?)```", re.S)
MARKER = re.compile(r"<!-- (test|not run): (.*?) -->")
RUNNABLE = ("python", "bash", "shell", "sh")


@dataclasses.dataclass
class Block:
    page: str
    line: int
    language: str
    code: str
    markers: list[tuple[str, str]]

    def prepared(self, keras_home: Path) -> tuple[str, dict]:
        """The code with its substitutions, and its environment variables; a block that serves
        pre-trained weights downloads them into keras_home, so that no block reads a file
        another one downloaded."""
        code, env = self.code, {}
        for kind, text in self.markers:
            if kind != "test":
                continue
            if text.startswith("replace "):
                old, new = text[len("replace "):].split(" => ")
                assert old in code, f"{self.page}:{self.line}: {old!r} is not in the block"
                code = code.replace(old, new)
            elif text.startswith("serve pretrained "):
                env["VIT_KERAS_WEIGHTS_URL"] = serve_pretrained(*text.split()[2:])
                env["KERAS_HOME"] = str(keras_home)
            elif re.fullmatch(r"[A-Z_]+=\S*", text):
                key, value = text.split("=", 1)
                env[key] = value
            else:
                raise AssertionError(f"{self.page}:{self.line}: unknown marker {text!r}")
        return code, env

    @property
    def skip_reason(self) -> str | None:
        return next((text for kind, text in self.markers if kind == "not run"), None)


@functools.cache
def serve_pretrained(name: str, variant: str) -> str:
    """The address of a loopback server holding a random checkpoint of `name` for `variant`
    (VIT_KERAS_WEIGHTS_URL), written once per test process."""
    import tempfile

    root = Path(tempfile.mkdtemp())
    write_release_file(root, name, variant)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/"


def page_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in BLOCK.finditer(text):
        markers, language, code = match.groups()
        if language not in RUNNABLE:
            continue
        line = text[:match.start(2)].count("\n") + 1
        found.append(Block(page.name, line, language, code, MARKER.findall(markers)))
    return found


BLOCK_TIMEOUT_S = 900

# Runs each job read from stdin (a JSON line: code, folder, output files) in a child forked
# from this process, as `python -c CODE` would run it there, and answers its exit status (None
# past the timeout).
WARM_INTERPRETER = """
import json, os, sys, time, traceback
import vit_keras  # the imports that every block would otherwise pay for
import tensorflow
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(job["folder"])
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv, status = ["-c"], 0
        try:
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    deadline = time.monotonic() + job["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print("null", flush=True)
            break
        time.sleep(0.02)
"""


def block_env() -> dict:
    # `python` in a shell block is this interpreter, as in the reader's activated venv
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}


@functools.cache
def warm_interpreter() -> subprocess.Popen:
    """This test process's warm interpreter, started on first use; it ends with the process
    (its stdin closes)."""
    return subprocess.Popen([sys.executable, "-c", WARM_INTERPRETER], cwd=ROOT,
                            env=block_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def run_forked(code: str, folder: Path) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of code run as `python -c` in folder, forked from the warm
    interpreter."""
    server = warm_interpreter()
    outputs = {name: folder.parent / f"{folder.name}.{name}" for name in ("stdout", "stderr")}
    job = {"code": code, "folder": str(folder), "timeout": BLOCK_TIMEOUT_S,
           **{name: str(path) for name, path in outputs.items()}}
    server.stdin.write(json.dumps(job) + "\n")
    server.stdin.flush()
    answer = server.stdout.readline()
    assert answer, f"the warm interpreter ended (exit status {server.wait()})"
    status = json.loads(answer)
    texts = [path.read_text() for path in outputs.values()]
    for path in outputs.values():
        path.unlink()
    return status, *texts


# A line of a shell block that is one `vit-keras` command and nothing else of the shell's.
APP_COMMAND = re.compile(r"vit-keras [^$|;&<>`*?#\n]*")


def app_commands(code: str) -> list[str] | None:
    """Python code running each `vit-keras` command of a shell block as the console script
    does, or None if the block holds anything else."""
    lines = [line.strip() for line in code.replace("\\\n", " ").splitlines() if line.strip()]
    if not lines or not all(APP_COMMAND.fullmatch(line) for line in lines):
        return None
    return [f"import sys\nsys.argv = {shlex.split(line)!r}\n"
            "from vit_keras_apps.cli import main\nmain()\n" for line in lines]


def run_forked_commands(codes: list[str], folder: Path) -> tuple[int | None, str, str]:
    """run_forked for each code in turn, stopping at the first that fails, as bash -e does."""
    status, stdout, stderr = 0, "", ""
    for code in codes:
        status, out, err = run_forked(code, folder)
        stdout, stderr = stdout + out, stderr + err
        if status != 0:
            break
    return status, stdout, stderr


def run_block(block: Block, folder: Path, keras_home: Path) -> None:
    code, extra_env = block.prepared(keras_home)
    commands = app_commands(code) if block.language != "python" else None
    # a block that sets environment variables itself does so before its imports: it needs
    # an interpreter that has imported nothing yet
    if block.language == "python" and not extra_env and "os.environ" not in code:
        status, stdout, stderr = run_forked(code, folder)
    elif commands and not extra_env:
        status, stdout, stderr = run_forked_commands(commands, folder)
    else:
        command = ([sys.executable, "-c", code] if block.language == "python"
                   else ["bash", "-euo", "pipefail", "-c", code])
        done = subprocess.run(command, cwd=folder, env={**block_env(), **extra_env},
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        status, stdout, stderr = done.returncode, done.stdout, done.stderr
    assert status == 0, (f"{block.page}:{block.line} ({block.language}) failed "
                         f"(exit status {status}):\n{stdout[-1500:]}\n{stderr[-3000:]}")


def page_test_class(page: Path) -> type:
    """A test class for one page, a test for each of its examples, in the page's order and in
    one scratch folder, as a reader runs them. `pytest --dist loadscope` (scripts/test.sh)
    keeps a class on one worker and spreads the classes, so the pages run side by side."""
    blocks = [block for block in page_blocks(page) if block.skip_reason is None]

    @in_tensorflow_pass
    class Page:
        @pytest.fixture(scope="class")
        @staticmethod
        def folder(tmp_path_factory):
            folder = tmp_path_factory.mktemp(page.stem)
            (folder / "docs").symlink_to(ROOT / "docs")
            shutil.copyfile(PHOTO, folder / PHOTO.name)
            return folder

        @pytest.mark.parametrize("block", blocks, ids=[f"line{b.line}" for b in blocks])
        def test_example_runs(self, block, folder, request, tmp_path):
            failed = getattr(request.cls, "failed", None)
            if failed:
                pytest.fail(f"an earlier example of {page.name} failed ({failed})")
            try:
                run_block(block, folder, tmp_path / "keras_home")
            except BaseException:
                request.cls.failed = f"line {block.line}"
                raise

    return Page


@in_tensorflow_pass
def test_each_block_that_serves_weights_downloads_into_a_cache_of_its_own(tmp_path):
    markers = [("test", "serve pretrained augreg_in21k_ft_in1k Ti/16")]
    envs = [Block("page.md", line, "python", "pass\n", markers).prepared(tmp_path / str(line))[1]
            for line in (1, 9)]
    assert [env["KERAS_HOME"] for env in envs] == [str(tmp_path / "1"), str(tmp_path / "9")]
    assert envs[0]["VIT_KERAS_WEIGHTS_URL"] == envs[1]["VIT_KERAS_WEIGHTS_URL"]  # one server


for _page in PAGES:
    if any(block.skip_reason is None for block in page_blocks(_page)):
        globals()["TestPage_" + re.sub(r"\W", "_", _page.stem)] = page_test_class(_page)
