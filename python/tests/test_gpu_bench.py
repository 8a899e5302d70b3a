# SPDX-License-Identifier: MIT
"""bench/gpu_bench.py's bookkeeping, without a GPU: the verdict, the tile table and report,
FA_CUDA_TILE_D128's restore, the ceilings (fa_cuda_peak's output read, its failures reported,
%mma in the table and report), the timing of backends, gpu_bench_bwd.py's table and
gpu_bench_decode.py's table and arguments. The benchmarks themselves run only where torch sees a
GPU (scripts/gpu-check.sh), so a mistake in these paths would otherwise first show on a lent GPU
machine's scarce minutes."""

import json
import os
import stat

import pytest
from helpers import load_bench


@pytest.fixture(scope="module")
def gb():
    return load_bench("gpu_bench")


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
        rec["tiles"] = {"flashattn": "128x64", gb.ALT: "128x32"}  # bench_config's, on sm_90
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
    assert "as run above (128x64) and with FA_CUDA_TILE_D128=128x32" in lines[0]
    assert lines[1].split()[3:8] == ["128x64", "TF/s", "|", "128x32", "TF/s"]
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
    assert "| S | causal | 128x64 TFLOP/s | 128x32 TFLOP/s | 128x32 vs flash | 128x32 / 128x64 |" \
        in md


def test_d128_tiles(gb):
    """The tile flashattn runs at D = 128 and the other one: the plug-in's default by
    capability (fa__mma_d128_block_n), or the one FA_CUDA_TILE_D128 names."""
    assert gb.d128_tiles((9, 0), None) == ("128x64", "128x32")
    assert gb.d128_tiles((10, 0), "") == ("128x64", "128x32")
    assert gb.d128_tiles((8, 0), None) == ("128x32", "128x64")
    assert gb.d128_tiles((8, 9), None) == ("128x32", "128x64")
    assert gb.d128_tiles((9, 0), "128x32") == ("128x32", "128x64")
    assert gb.d128_tiles((8, 0), "128x64") == ("128x64", "128x32")


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


def fake_exe(tmp_path, name, body):
    """An executable shell script standing in for fa_cuda_peak."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


PEAK = {"device": "GPU", "capability": "sm_90", "sms": 132, "clock_mhz": 1980,
        "mma_bf16_tflops": 400.0, "mma_ms": 20.0, "ex2_gops": 4000.0, "ex2_ms": 20.0, "runs": 7}


def test_run_peak(gb, tmp_path):
    ok = fake_exe(tmp_path, "ok", f"echo '{json.dumps(PEAK)}'")
    assert gb.run_peak(ok) == PEAK

    no_gpu = fake_exe(tmp_path, "nogpu", "echo 'fa_cuda_peak: no CUDA device: none' >&2; exit 2")
    r = gb.run_peak(no_gpu)
    assert list(r) == ["error"] and "exited with 2" in r["error"] and "no CUDA device" in r["error"]

    garbage = fake_exe(tmp_path, "garbage", "echo not json")
    assert "unreadable output" in gb.run_peak(garbage)["error"]
    zero = fake_exe(tmp_path, "zero", f"echo '{json.dumps(dict(PEAK, ex2_gops=0))}'")
    assert "non-positive" in gb.run_peak(zero)["error"]
    assert "no fa_cuda_peak" in gb.run_peak(None)["error"]


def test_peak_exe_search(gb, tmp_path, monkeypatch):
    args = gb.parse_args([])
    monkeypatch.setenv("FLASHATTN_LIBRARY", str(tmp_path / "libflashattn.so"))
    beside = fake_exe(tmp_path, gb.PEAK_EXE, "exit 0")
    assert gb.peak_exe(args) == beside
    assert gb.peak_exe(gb.parse_args(["--peak-exe", "/x/y"])) == "/x/y"
    os.remove(beside)
    found = gb.peak_exe(args)
    assert found is None or found == os.path.join(gb.ROOT, "build-gpu", gb.PEAK_EXE)


def test_ceilings_in_table_and_report(gb):
    rows = [record(gb, 2048, 128, False, 2.0, 1.9)]
    ceil = {"mma": PEAK, "matmul": {"tflops": 780.0, "ms": 1.4}}
    line = gb.ceilings_line(ceil)
    assert "mma.sync m16n8k16 bf16 400.0 TFLOP/s" in line and "4000 Gop/s" in line
    assert "8192^3 780.0 TFLOP/s" in line
    pct = "%.0f%%" % (100 * rows[0]["backends"]["flashattn"]["tflops"] / 400.0)
    pct_flash = "%.0f%%" % (100 * rows[0]["backends"]["torch-flash"]["tflops"] / 400.0)
    row = gb.table(rows, False, ceil).splitlines()[2].split()
    assert row[7:10] == ["%.1f" % rows[0]["backends"]["flashattn"]["tflops"], pct, "|"]
    assert row[11:13] == ["%.1f" % rows[0]["backends"]["torch-flash"]["tflops"], pct_flash]
    # without a measured mma rate the column says n/a
    failed = {"mma": {"error": "fa_cuda_peak exited with 2: no CUDA device"},
              "matmul": {"error": "RuntimeError: out of memory"}}
    assert gb.table(rows, False, failed).splitlines()[2].split()[8] == "n/a"
    assert gb.table(rows, False).splitlines()[2].split()[8] == "n/a"
    assert gb.ceilings_line(failed) == ("Ceilings measured in this run: mma.sync n/a "
                                        "(fa_cuda_peak exited with 2: no CUDA device); bf16 "
                                        "matmul n/a (RuntimeError: out of memory)")

    doc = {"machine": {"gpu": "GPU", "capability": "sm_90", "torch": "t", "torch_cuda": "13"},
           "date": "d", "command": "c", "timer": "t", "tol": 2e-2, "check_only": False,
           "ceilings": ceil, "results": rows, "skipped": [], "verdict": "ok"}
    md = gb.markdown(doc)
    assert "- " + line + "; %mma = TFLOP/s over the mma.sync rate" in md
    assert "| %.1f | %s | 1.900 | %.1f | %s |" % (
        rows[0]["backends"]["flashattn"]["tflops"], pct,
        rows[0]["backends"]["torch-flash"]["tflops"], pct_flash) in md


def test_torch_flash_impl(gb, monkeypatch):
    """The report names the flash implementation behind SDPA's FLASH_ATTENTION backend."""
    import sys
    import types

    def fake_torch(**attention_attrs):
        torch, nn = types.ModuleType("torch"), types.ModuleType("torch.nn")
        attention = types.ModuleType("torch.nn.attention")
        for k, v in attention_attrs.items():
            setattr(attention, k, v)
        torch.nn, nn.attention = nn, attention
        for name, mod in (("torch", torch), ("torch.nn", nn), ("torch.nn.attention", attention)):
            monkeypatch.setitem(sys.modules, name, mod)
        return torch

    old = fake_torch()
    assert gb.torch_flash_impl(old) == "built-in (FA2; this torch cannot switch implementations)"
    default = fake_torch(current_flash_attention_impl=lambda: None,
                         list_flash_attention_impls=lambda: ["FA3", "FA4"])
    assert gb.torch_flash_impl(default) == "built-in (FA2); registered: FA3, FA4"
    fa3 = fake_torch(current_flash_attention_impl=lambda: "FA3",
                     list_flash_attention_impls=lambda: ["FA3"])
    assert gb.torch_flash_impl(fa3) == "FA3 (activated); registered: FA3"


def test_time_backends_times_ratios_and_errors(gb):
    """time_backends (shared by gpu_bench.py and gpu_bench_bwd.py): a backend with an error is
    not timed, one whose timing raises becomes an error, the others get TF/s and ratios."""
    rec = {"flops": 2e12, "backends": {"cudnn": {"error": "no cuDNN"}}}

    def timer(fn, target_ms):
        fn()
        return {"flashattn": 4.0, "torch-flash": 6.0}[calls[-1]], 7

    calls = []
    fns = {"flashattn": (lambda: calls.append("flashattn"), None),
           "torch-flash": (lambda: calls.append("torch-flash"), None),
           "cudnn": (lambda: calls.append("cudnn"), None),
           "broken": (lambda: calls.append("broken"), None)}
    gb.time_backends(fns, rec, timer, 100)
    assert "cudnn" not in calls
    assert rec["backends"]["flashattn"] == {"ms": 4.0, "runs": 7, "tflops": 500.0}
    assert "KeyError" in rec["backends"]["broken"]["error"]
    assert rec["ratio_vs_torch_flash"] == 1.5 and rec["ratio_vs_cudnn"] is None


def test_backward_bench_table():
    """gpu_bench_bwd.py's table: TF/s, ratios, the check and the determinism column."""
    gbb = load_bench("gpu_bench_bwd")
    rec = {"S": 1024, "B": 16, "H": 16, "D": 128, "causal": True, "tol": 3e-2,
           "backends": {"flashattn": {"ms": 2.0, "tflops": 100.0},
                        "torch-flash": {"ms": 3.0, "tflops": 66.7}, "cudnn": {"error": "x"}},
           "check": {"reference": "torch-flash", "flashattn": 1e-2},
           "ratio_vs_torch_flash": 1.5, "ratio_vs_cudnn": None, "deterministic": True}
    row = gbb.table([rec]).splitlines()[-1]
    assert "100.0" in row and "1.50x" in row and "ok 1.0e-02" in row and row.endswith("yes")
    rec["deterministic"] = False
    assert gbb.table([rec]).splitlines()[-1].endswith(" NO")


def test_decode_bench_table_and_args():
    """gpu_bench_decode.py: the cache bytes, GB/s and %copy in the table, a failed check shown,
    configurations over --max-cache-gb left out by the grid, and a bad layout refused."""
    gbd = load_bench("gpu_bench_decode")
    assert gbd.cache_bytes(8, 16384) == 8 * 16384 * 8 * 128 * 2 * 2
    rec = {"B": 8, "L": 16384, "layout": "paged16", "tol": 2e-2,
           "backends": {"flashattn": {"ms": 0.05, "gbps": 2684.4}, "sdpa": {"ms": 0.1,
                                                                            "gbps": 1342.2}},
           "check": {"flashattn": 4e-3}, "ratio_vs_sdpa": 2.0}
    row = gbd.table([rec], 3000.0).splitlines()[-1]
    assert "50.0" in row and "2684" in row and "89%" in row and "2.00x" in row
    assert row.endswith("ok 4.0e-03")
    rec["check"]["flashattn"] = 5e-2
    assert "FAIL 5.0e-02" in gbd.table([rec], 3000.0)
    args = gbd.parse_args(["--batches", "1,64", "--lengths", "1024,131072"])
    assert args.batches == [1, 64] and args.lengths == [1024, 131072]
    assert gbd.cache_bytes(64, 131072) > args.max_cache_gb * (1 << 30)  # left out by main()
    with pytest.raises(SystemExit):
        gbd.parse_args(["--layouts", "paged7"])
