"""Shared helpers for the flashattn Python tests (pytest puts this folder on sys.path, so test
files `from helpers import ...`; flashattn itself is the installed package under `make test`)."""

import os

import flashattn
import numpy as np
import pytest


def pytest_report_header(config):
    lines = [f"flashattn {flashattn.__version__} from {os.path.dirname(flashattn.__file__)}"]
    try:
        lines.append(f"libflashattn: {flashattn.library_path()}")
        lines.append(f"build: {flashattn.build_info()}")
    except ImportError as e:
        lines.append(f"libflashattn: NOT LOADED ({e})")
    try:
        import torch

        lines.append(f"torch {torch.__version__}: torch tests run")
    except ImportError:
        lines.append("torch not installed: torch tests are skipped (make test-torch runs them)")
    return lines


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
