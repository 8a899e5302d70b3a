"""ring-flash-attention (zhuzilin/ring-flash-attention, PyPI ring-flash-attn), unchanged, on
flashattn: its kernels call flash-attn's private _flash_attn_forward/_flash_attn_backward, which
here are flashattn's (the `flash_attn` module aliased to flashattn, as docs/python.md shows).
Its ring, zigzag ring and stripe functions on gloo over loopback (world sizes 2 and 3), in bf16
(ring-flash-attn returns dq in bf16 whatever the input dtype), each rank's output and gradients
against fp32 flashattn.flash_attn_func on the whole sequence: within twice the error of bf16
flash_attn_func on the whole sequence, plus one bf16 ulp (flash-attn's rule, as
test_parallel.py's bf16 test). Skipped, with the reason, where ring-flash-attn is not
installed (`make test-torch` installs it)."""

import datetime
import importlib.util
import json
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
if importlib.util.find_spec("ring_flash_attn") is None:
    pytest.skip("ring-flash-attn is not installed (pip install ring-flash-attn)",
                allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import flashattn  # noqa: E402
from helpers import free_port  # noqa: E402

TIMEOUT_S = 60
# name: (ring-flash-attn module, function, causal, how the sequence is split)
CASES = {
    "ring_causal": ("ring_flash_attn", "ring_flash_attn_func", True, "contiguous"),
    "ring_full": ("ring_flash_attn", "ring_flash_attn_func", False, "contiguous"),
    "zigzag_causal": ("zigzag_ring_flash_attn", "zigzag_ring_flash_attn_func", True, "zigzag"),
    "stripe_causal": ("stripe_flash_attn", "stripe_flash_attn_func", True, "stripe"),
}


def _point_flash_attn_at_flashattn():
    """`import flash_attn.flash_attn_interface` gives flashattn's; ring_flash_attn's modules
    are imported without its package __init__ (which imports transformers for its adapter)."""
    fa = types.ModuleType("flash_attn")
    fa.flash_attn_interface = flashattn.flash_attn_interface
    sys.modules["flash_attn"] = fa
    sys.modules["flash_attn.flash_attn_interface"] = flashattn.flash_attn_interface
    pkg = types.ModuleType("ring_flash_attn")
    pkg.__path__ = list(importlib.util.find_spec("ring_flash_attn").submodule_search_locations)
    sys.modules["ring_flash_attn"] = pkg



def _slice(x, rank, world, split):
    """This rank's tokens (dim 1) in ring-flash-attention's layouts."""
    if split == "stripe":  # token t on rank t % world
        return x[:, rank::world]
    from flashattn import parallel
    return parallel.split_sequence(x, rank, world, split)


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / max(1.0, b.float().abs().max()))


def _whole(q, k, v, dout, causal, dtype):
    """flashattn.flash_attn_func's out, dq, dk, dv on the whole sequence (in dtype, if given)."""
    w = [(t if dtype is None else t.to(dtype)).clone().requires_grad_(True) for t in (q, k, v)]
    out = flashattn.flash_attn_func(*w, causal=causal)
    out.backward(dout if dtype is None else dout.to(dtype))
    return [out.detach()] + [t.grad for t in w]


def _worker(rank, world, port, outdir):
    import importlib

    _point_flash_attn_at_flashattn()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    res = {}
    try:
        g = torch.Generator().manual_seed(7 + world)
        B, S, H, D = 2, 8 * world, 4, 16
        q, k, v, dout = (torch.randn(B, S, H, D, generator=g).bfloat16() for _ in range(4))
        for case, (module, fn, causal, split) in CASES.items():
            func = getattr(importlib.import_module(f"ring_flash_attn.{module}"), fn)
            x = [_slice(t, rank, world, split).clone().requires_grad_(True) for t in (q, k, v)]
            out = func(*x, causal=causal)
            out.backward(_slice(dout, rank, world, split))
            got = [out.detach()] + [t.grad for t in x]
            ref, whole = (_whole(q, k, v, dout, causal, dt) for dt in (torch.float32, None))
            ref, whole = ([_slice(t, rank, world, split) for t in r] for r in (ref, whole))
            res[case] = {"ring": [_rel(a, b) for a, b in zip(got, ref)],
                         "whole": [_rel(a, b) for a, b in zip(whole, ref)]}
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_ring_flash_attn_runs_on_flashattn(world, tmp_path):
    mp.start_processes(_worker, args=(world, free_port(), str(tmp_path)), nprocs=world,
                       join=True, start_method="spawn")
    for rank in range(world):
        res = json.load(open(tmp_path / f"rank{rank}.json"))
        assert "error" not in res, f"rank {rank}: {res['error']}"
        for case in CASES:
            r = res[case]
            for name, e, w in zip(("out", "dq", "dk", "dv"), r["ring"], r["whole"]):
                assert e <= 2 * w + 2 ** -8, (
                    f"world {world} rank {rank} {case} {name}: {e:.2e} vs whole-sequence {w:.2e}")
