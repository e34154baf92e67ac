"""Command-line programs: `python -m apps.NAME` in a checkout, `vit-keras NAME` installed.

TensorFlow's start-up log lines are silenced before anything imports TensorFlow, unless
--verbose is given (or TF_CPP_MIN_LOG_LEVEL is set already). Some of them (oneDNN's, on
CPUs with AVX-512) are written before TensorFlow reads its log level, so Keras and TensorFlow
are imported here with the process's stderr closed: Keras first, as its PyTorch backend's
compiler crashes the process when loaded after TensorFlow."""

import os
import sys


def _import_keras_and_tensorflow_without_stderr():
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


if "--verbose" in sys.argv:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
else:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _import_keras_and_tensorflow_without_stderr()
