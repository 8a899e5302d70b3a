# SPDX-License-Identifier: MIT
"""The examples run and check themselves: KV-cache generation (every step against full
attention) and context parallelism on two gloo ranks (against one process)."""
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "generate.py"


def test_generate_example_fp32_and_fp16():
    for dtype in ("float32", "float16"):
        r = subprocess.run([sys.executable, str(EXAMPLE), "--tokens", "40", "--dtype", dtype],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "every step matched NumPy fp64 attention" in r.stdout


def test_context_parallel_example_on_two_ranks():
    """examples/context_parallel.py under torchrun: 2 gloo ranks match one process, by ring
    and by all-gather attention."""
    pytest.importorskip("torch.distributed")
    example = EXAMPLE.parent / "context_parallel.py"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        str(example), "--seqlen", "512"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for method in ("ring", "all_gather"):
        line = f"{method}_attention, 2 ranks, 512 tokens (zigzag split)"
        assert line in r.stdout and r.stdout.count("-> OK") == 2, r.stdout
