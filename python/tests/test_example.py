# SPDX-License-Identifier: MIT
"""The KV-cache generation example runs and checks itself (every step against full attention)."""
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "generate.py"


def test_generate_example_fp32_and_fp16():
    for dtype in ("float32", "float16"):
        r = subprocess.run([sys.executable, str(EXAMPLE), "--tokens", "40", "--dtype", dtype],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "every step matched NumPy fp64 attention" in r.stdout
