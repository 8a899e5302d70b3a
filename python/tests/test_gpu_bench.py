# SPDX-License-Identifier: MIT
"""bench/gpu_bench.py's bookkeeping, without a GPU: the verdict, the tile table and report, and
FA_CUDA_TILE_D128's restore. The benchmark itself runs only where torch sees a GPU
(scripts/gpu-check.sh), so a mistake in these paths would otherwise first show on a lent GPU
machine's scarce minutes."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def gb():
    spec = importlib.util.spec_from_file_location(
        "gpu_bench", os.path.join(ROOT, "bench", "gpu_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def record(gb, S, D, causal, fa_ms, flash_ms, alt_ms=None, err=1e-3, alt_err=1e-3):
    """A result as bench_config makes it (flops for B·S = 16384, H·D = 2048)."""
    B, H = gb.TOKENS // S, gb.HIDDEN // D
    flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    rec = {"S": S, "B": B, "H": H, "D": D, "causal": causal, "dtype": "bf16", "flops": flops,
           "tol": 2e-2, "backends": {}, "check": {"reference": "torch-flash", "flashattn": err}}
    for name, ms in (("flashattn", fa_ms), ("torch-flash", flash_ms), (gb.ALT, alt_ms)):
        if ms is not None:
            rec["backends"][name] = {"ms": ms, "runs": 10, "tflops": flops / (ms * 1e-3) / 1e12}
    rec["backends"]["cudnn"] = {"error": "RuntimeError: no cuDNN here"}
    rec["ratio_vs_torch_flash"] = flash_ms / fa_ms
    rec["ratio_vs_cudnn"] = None
    if alt_ms is not None:
        rec["check"][gb.ALT] = alt_err
        rec["alt_ratio_vs_torch_flash"] = flash_ms / alt_ms
        rec["alt_speedup"] = fa_ms / alt_ms
    if not (err <= 2e-2) or (alt_ms is not None and not (alt_err <= 2e-2)):
        rec["check"]["mismatch"] = True
    return rec


def test_tile_table_and_report(gb):
    rows = [record(gb, 2048, 64, False, 1.0, 1.1),
            record(gb, 2048, 128, False, 2.0, 1.9, alt_ms=1.6),
            record(gb, 4096, 128, True, 2.0, 2.2, alt_ms=2.5)]
    text = gb.tile_table(rows)
    lines = text.splitlines()
    assert "FA_CUDA_TILE_D128=128x64" in lines[0]
    assert len(lines) == 3 + 2  # title, head, rule, the two D = 128 rows
    assert lines[3].split() == ["2048", "0", "|", "%.1f" % rows[1]["backends"]["flashattn"]
                                ["tflops"], "|", "%.1f" % rows[1]["backends"][gb.ALT]["tflops"],
                                "|", "1.19x", "|", "1.25x", "|", "ok", "1.0e-03"]
    assert lines[4].split()[-6:] == ["0.88x", "|", "0.80x", "|", "ok", "1.0e-03"]
    assert gb.tile_table([rows[0]]) == ""

    doc = {"machine": {"gpu": "GPU", "capability": "sm_90", "torch": "t", "torch_cuda": "13"},
           "date": "d", "command": "c", "timer": "t", "tol": 2e-2, "check_only": False,
           "results": rows, "skipped": [], "verdict": "ok"}
    md = gb.markdown(doc)
    assert "| 2048 | 0 | %.1f | %.1f | 1.19x | 1.25x | ok 1.0e-03 |" % (
        rows[1]["backends"]["flashattn"]["tflops"], rows[1]["backends"][gb.ALT]["tflops"]) in md
    assert "| 0.88x | 0.80x | ok 1.0e-03 |" in md


def test_verdict(gb):
    ok = [record(gb, 2048, 128, False, 2.0, 1.9, alt_ms=1.6)]
    verdict, rc = gb.verdict_of(ok, [])
    assert rc == 0 and verdict.startswith("ok")

    bad_alt = [record(gb, 2048, 128, False, 2.0, 1.9, alt_ms=1.6, alt_err=0.5)]
    verdict, rc = gb.verdict_of(bad_alt, [])
    assert rc == 1 and "disagrees" in verdict

    failed_alt = [record(gb, 2048, 128, False, 2.0, 1.9, alt_ms=1.6)]
    failed_alt[0]["backends"][gb.ALT] = {"error": "RuntimeError: out of shared memory"}
    verdict, rc = gb.verdict_of(failed_alt, ["S=4096 D=128 causal=0"])
    assert rc == 1 and gb.ALT in verdict and "out of shared memory" in verdict
    assert verdict.endswith("1 configuration(s) not run (time budget)")

    assert gb.verdict_of([], [])[1] == 1


def test_tile_env_restores(gb, monkeypatch):
    monkeypatch.delenv(gb.TILE_ENV, raising=False)
    with gb.tile_env("128x64"):
        assert os.environ[gb.TILE_ENV] == "128x64"
    assert gb.TILE_ENV not in os.environ
    monkeypatch.setenv(gb.TILE_ENV, "128x32")
    with pytest.raises(RuntimeError):
        with gb.tile_env("128x64"):
            raise RuntimeError("a failing call")
    assert os.environ[gb.TILE_ENV] == "128x32"
