"""Every example in README.md and docs/*.md runs as written: each page's Python blocks and
shell commands, in order, each in a fresh process, in one scratch folder per page.

Markers, HTML comments on the lines just before a block, adapt a block for the test:
    <!-- test: replace OLD => NEW -->   a test-only substitution (a smaller variant, fewer
                                        epochs); OLD must occur in the block
    <!-- test: ENV=VALUE -->            an environment variable for this block
    <!-- test: serve pretrained NAME VARIANT -->
                                        pre-trained names download from a loopback server
                                        that holds a random checkpoint of NAME for VARIANT,
                                        in the layout of its release's file
    <!-- not run: REASON -->            the block is shown but not run, for the reason given
A shell block's lines run with bash; lines of a shell block are commands a reader types.
"""

import dataclasses
import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import write_release_file

ROOT = Path(__file__).parents[1]
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

    def prepared(self) -> tuple[str, dict]:
        """The code with its substitutions, and its environment variables."""
        code, env = self.code, {}
        for kind, text in self.markers:
            if kind != "test":
                continue
            if text.startswith("replace "):
                old, new = text[len("replace "):].split(" => ")
                assert old in code, f"{self.page}:{self.line}: {old!r} is not in the block"
                code = code.replace(old, new)
            elif text.startswith("serve pretrained "):
                env.update(serve_pretrained(*text.split()[2:]))
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
def serve_pretrained(name: str, variant: str) -> dict:
    """A loopback server holding a random checkpoint of `name` for `variant`; the environment
    that points the registry (and an empty Keras cache) at it."""
    import tempfile

    root = Path(tempfile.mkdtemp())
    write_release_file(root, name, variant)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return {"VIT_KERAS_WEIGHTS_URL": f"http://127.0.0.1:{server.server_port}/",
            "KERAS_HOME": str(root / "keras_home")}


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


def run_block(block: Block, folder: Path) -> None:
    code, extra_env = block.prepared()
    # `python` in a shell block is this interpreter, as in the reader's activated venv
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
           **extra_env}
    command = ([sys.executable, "-c", code] if block.language == "python"
               else ["bash", "-euo", "pipefail", "-c", code])
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, (f"{block.page}:{block.line} ({block.language}) failed:\n"
                                  f"{done.stdout[-1500:]}\n{done.stderr[-3000:]}")


def page_test_class(page: Path) -> type:
    """A test class for one page, a test for each of its examples, in the page's order and in
    one scratch folder, as a reader runs them. `pytest --dist loadscope` (scripts/test.sh)
    keeps a class on one worker and spreads the classes, so the pages run side by side."""
    blocks = [block for block in page_blocks(page) if block.skip_reason is None]

    @pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
                        reason="the examples run once, in the suite's TensorFlow pass; a block "
                               "that needs another backend says so with a KERAS_BACKEND marker")
    class Page:
        @pytest.fixture(scope="class")
        def folder(self, tmp_path_factory):
            folder = tmp_path_factory.mktemp(page.stem)
            (folder / "docs").symlink_to(ROOT / "docs")
            return folder

        @pytest.mark.parametrize("block", blocks, ids=[f"line{b.line}" for b in blocks])
        def test_example_runs(self, block, folder, request):
            failed = getattr(request.cls, "failed", None)
            if failed:
                pytest.fail(f"an earlier example of {page.name} failed ({failed})")
            try:
                run_block(block, folder)
            except BaseException:
                request.cls.failed = f"line {block.line}"
                raise

    return Page


for _page in PAGES:
    if any(block.skip_reason is None for block in page_blocks(_page)):
        globals()["TestPage_" + re.sub(r"\W", "_", _page.stem)] = page_test_class(_page)
