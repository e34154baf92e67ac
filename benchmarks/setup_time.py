"""The set-up's time on a fresh clone: the committed tree (git archive HEAD) unpacked into an
empty folder, then `bash scripts/setup.sh PURPOSE` there with an empty pip cache, as on a
fresh machine, timed from start to end, with the machine and the pip that ran. Needs only the
standard library, so any Python runs it.

python -m benchmarks.setup_time [--purpose main|test] [--json docs/mainjob/setup.json]
"""

import argparse
import os
import subprocess
import tempfile
import time

from benchmarks import write_json
from benchmarks.machine import describe_host


def fresh_clone(folder: str) -> None:
    """The committed tree of this checkout, as a clone would have it, in folder."""
    archive = subprocess.run(["git", "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)


def time_setup(purpose: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        fresh_clone(folder)
        started = time.monotonic()
        cache = os.path.join(folder, ".pip-cache")
        subprocess.run(["bash", "scripts/setup.sh", purpose], cwd=folder, check=True,
                       env={**os.environ, "PIP_CACHE_DIR": cache})
        seconds = time.monotonic() - started
        pip = subprocess.run([os.path.join(folder, ".venv", "bin", "python"), "-m", "pip",
                              "--version"], check=True, capture_output=True, text=True)
    return {"command": f"bash scripts/setup.sh {purpose}", "seconds": round(seconds, 1),
            "pip": pip.stdout.split(" from ")[0], "machine": describe_host()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--purpose", default="main", choices=["main", "test"])
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args(argv)
    report = time_setup(args.purpose)
    write_json(report, args.json)
    print(f"{report['command']} on a fresh clone: {report['seconds']} s ({report['pip']})")
    return report


if __name__ == "__main__":
    main()
