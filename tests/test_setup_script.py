"""scripts/setup.sh: one pip run for each purpose, nothing when .venv is already set up for it or
for more, and a clear refusal of an unknown purpose. A stand-in .venv/bin/python records the
pip commands instead of running them."""

import hashlib
import shutil
import subprocess
from pathlib import Path

from tests.conftest import backend_independent

ROOT = Path(__file__).resolve().parent.parent
RECORDING_PYTHON = '#!/usr/bin/env bash\necho "$*" >> "$(dirname "$0")/../calls.txt"\n'


def checkout_with_venv(tmp_path: Path, stamp_purpose: str | None) -> tuple[Path, str]:
    """A folder holding setup.sh and pyproject.toml, whose .venv's python records its calls,
    stamped for stamp_purpose (None: not stamped); and the script's stamp hash."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(RECORDING_PYTHON)
    python.chmod(0o755)
    digest = hashlib.sha256((tmp_path / "pyproject.toml").read_bytes()
                            + (tmp_path / "scripts" / "setup.sh").read_bytes()).hexdigest()
    if stamp_purpose:
        (tmp_path / ".venv" / "setup-stamp").write_text(f"{digest} {stamp_purpose}\n")
    return tmp_path, digest


def setup(folder: Path, *purpose: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/setup.sh", *purpose], cwd=folder,
                          capture_output=True, text=True)


def calls(folder: Path) -> list[str]:
    path = folder / ".venv" / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


@backend_independent
def test_each_purpose_installs_in_one_pip_run_and_stamps_it(tmp_path):
    folder, digest = checkout_with_venv(tmp_path, None)
    done = setup(folder, "main")
    assert done.returncode == 0, done.stderr
    assert calls(folder) == ["-m pip install --quiet -e .[cpu,jax,torch]"]
    assert (folder / ".venv" / "setup-stamp").read_text().split() == [digest, "main"]
    assert "installed for 'main' in" in done.stdout
    done = setup(folder)  # the test suite's: a larger purpose than the stamp's
    assert done.returncode == 0, done.stderr
    assert calls(folder)[1:] == ["-m pip install --quiet -e .[cpu,jax,torch,export,test,cv,docs]",
                                 "-m pip install --quiet --no-deps keras-hub==0.32.0"]
    assert (folder / ".venv" / "setup-stamp").read_text().split() == [digest, "test"]


@backend_independent
def test_a_venv_set_up_for_as_much_or_more_is_kept(tmp_path):
    folder, _ = checkout_with_venv(tmp_path, "test")
    for purpose in ("main", "test"):
        done = setup(folder, purpose)
        assert done.returncode == 0 and f"ready for '{purpose}' (0 s)" in done.stdout
    assert calls(folder) == []


@backend_independent
def test_a_venv_stamped_for_other_requirements_is_set_up_again(tmp_path):
    """pyproject.toml or setup.sh changed since the stamp (another hash): pip runs."""
    folder, digest = checkout_with_venv(tmp_path, None)
    (folder / ".venv" / "setup-stamp").write_text(f"{'0' * len(digest)} test\n")
    done = setup(folder, "main")
    assert done.returncode == 0, done.stderr
    assert calls(folder) == ["-m pip install --quiet -e .[cpu,jax,torch]"]
    assert (folder / ".venv" / "setup-stamp").read_text().split() == [digest, "main"]


@backend_independent
def test_an_unknown_purpose_is_refused_by_name(tmp_path):
    folder, _ = checkout_with_venv(tmp_path, None)
    done = setup(folder, "everything")
    assert done.returncode == 2
    assert done.stderr.strip() == "setup.sh: expected 'main' or 'test', got 'everything'"
    assert calls(folder) == []
