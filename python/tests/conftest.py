"""The Python package's tests. They import the installed package (`pip install .`); where it, or
PyTorch for the backend's tests, cannot be imported they skip with a message, unless
FUSEBOX_REQUIRE_PYTHON=1 (set by .ci/run, which installs both), where they fail."""

import importlib
import os

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
