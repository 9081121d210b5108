"""The Python package's tests. They import the installed package (`pip install .`); where it, or
PyTorch for the backend's tests, cannot be imported they skip with a message, unless
FUSEBOX_REQUIRE_PYTHON=1 (set by .ci/run, which installs both), where they fail."""

import importlib
import os
import threading

import pytest

REQUIRED = os.environ.get("FUSEBOX_REQUIRE_PYTHON") == "1"


def need(module: str):
    """Imports `module`, or skips the test (fails it under FUSEBOX_REQUIRE_PYTHON=1)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if REQUIRED:
            raise
        pytest.skip(f"{module} cannot be imported ({e}); `pip install .` and PyTorch run these tests")


def errors_in_threads(work, count: int):
    """Runs `work()` on `count` threads at once and returns what each raised (as `repr`)."""
    errors = []

    def guarded():
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - returned to the test
            errors.append(repr(e))

    workers = [threading.Thread(target=guarded) for _ in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return errors
