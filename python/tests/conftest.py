"""Shared helpers for the flashattn Python tests (pytest puts this folder on sys.path, so test
files `from helpers import ...`; flashattn itself is the installed package under `make test`)."""

import os

import flashattn
import numpy as np
import pytest
from helpers import SEED, seeded


def pytest_report_header(config):
    lines = [f"flashattn {flashattn.__version__} from {os.path.dirname(flashattn.__file__)}",
             f"seed: {SEED} (FA_TEST_SEED={SEED} draws this run's inputs again)"]
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


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if terminalreporter.stats.get("failed"):
        terminalreporter.write_line(f"inputs of this run: FA_TEST_SEED={SEED} draws them again")


@pytest.fixture
def rng(request):
    """Fresh inputs each run, their own for each test (seeded by the test's id)."""
    return np.random.default_rng(seeded(request.node.nodeid))
