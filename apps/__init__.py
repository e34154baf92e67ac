"""Command-line programs: `python -m apps.NAME` in a checkout, `vit-keras NAME` installed.

TensorFlow's start-up log lines are silenced before anything imports TensorFlow, unless
--verbose is given (or TF_CPP_MIN_LOG_LEVEL is set already)."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if "--verbose" in sys.argv else "3")
