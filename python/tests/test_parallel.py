"""flashattn.parallel on gloo over loopback: world sizes 2, 3 and 4, ring and all-gather
attention, each rank's output and gradients against one process running flash_attn_func on the
whole sequence (fp32: 1e-5 relative; bf16: within twice whole-sequence bf16's error against
fp32), causal and not, a causal window, GQA, softcap, ALiBi, the contiguous and zigzag splits;
split_sequence and gather_sequence round trips; and arguments wrong or different on one rank
failing every rank with one clear message within the timeout (never a hang)."""

import datetime
import json
import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import flashattn  # noqa: E402
from helpers import free_port  # noqa: E402

# name: (method, causal, window_size, split, softcap, alibi, H, Hk)
CASES = {
    "causal": ("all_gather", True, (-1, -1), "contiguous", 0.0, False, 4, 2),
    "causal_zigzag": ("all_gather", True, (-1, -1), "zigzag", 0.0, True, 4, 4),
    "full": ("all_gather", False, (-1, -1), "contiguous", 3.0, False, 4, 1),
    "causal_window": ("all_gather", True, (5, 0), "zigzag", 0.0, False, 2, 2),
    "full_alibi": ("all_gather", False, (-1, -1), "contiguous", 0.0, True, 4, 2),
    "window_alibi": ("all_gather", False, (3, 2), "zigzag", 0.0, True, 2, 1),
    "window_right": ("all_gather", False, (-1, 5), "contiguous", 1.5, False, 2, 2),
    "ring_causal": ("ring", True, (-1, -1), "contiguous", 0.0, False, 4, 2),
    "ring_causal_zigzag": ("ring", True, (-1, -1), "zigzag", 2.5, False, 4, 1),
    "ring_full": ("ring", False, (-1, -1), "contiguous", 0.0, False, 2, 2),
    "ring_full_zigzag": ("ring", False, (-1, -1), "zigzag", 3.0, False, 4, 2),
}
TIMEOUT_S = 60



def _inputs(world, dtype, H, Hk):
    g = torch.Generator().manual_seed(1000 + world)
    B, S, D = 2, 8 * world, 16  # 8 tokens a rank: zigzag chunks of 4
    q = torch.randn(B, S, H, D, generator=g).to(dtype)
    k, v = (torch.randn(B, S, Hk, D, generator=g).to(dtype) for _ in range(2))
    dout = torch.randn(B, S, H, D, generator=g).to(dtype)
    slopes = torch.rand(H, generator=g) * 0.3
    return q, k, v, dout, slopes


def _whole(q, k, v, dout, slopes, case):
    _, causal, window, split, softcap, alibi, H, Hk = CASES[case]
    x = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = flashattn.flash_attn_func(*x, causal=causal, window_size=window, softcap=softcap,
                                    alibi_slopes=slopes if alibi else None)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in x]


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / max(1.0, b.float().abs().max()))


def _ulps(a, b):
    """The largest |a - b| in units of b's last place (bf16: 2^-7 of its power of two)."""
    a, b = a.float(), b.float()
    ulp = torch.exp2(torch.floor(torch.log2(b.abs().clamp_min(2.0 ** -100))) - 7)
    return float(((a - b).abs() / ulp).max())


def _worker(rank, world, port, outdir, dtype_name):
    from flashattn import parallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    res = {}
    try:
        dtype = getattr(torch, dtype_name)
        for case, (method, causal, window, split, softcap, alibi, H, Hk) in CASES.items():
            q, k, v, dout, slopes = _inputs(world, dtype, H, Hk)
            mine = [parallel.split_sequence(t, rank, world, split) for t in (q, k, v, dout)]
            x = [t.clone().requires_grad_(True) for t in mine[:3]]
            attend = getattr(parallel, method + "_attention")
            out = attend(*x, causal=causal, window_size=window, softcap=softcap, split=split,
                         alibi_slopes=slopes if alibi else None)
            out.backward(mine[3])
            got = [out.detach()] + [t.grad for t in x]
            whole = [parallel.split_sequence(t, rank, world, split)
                     for t in _whole(q, k, v, dout, slopes, case)]
            errs = [_rel(a, b) for a, b in zip(got, whole)]
            if dtype != torch.float32:  # both against fp32 on the same (rounded) inputs
                ref = [parallel.split_sequence(t, rank, world, split)
                       for t in _whole(*(t.float() for t in (q, k, v, dout)), slopes, case)]
                res[case] = {"split": [_rel(a, b) for a, b in zip(got, ref)],
                             "whole": [_rel(a, b) for a, b in zip(whole, ref)],
                             "ulps": _ulps(got[0], whole[0])}
                continue
            back = parallel.gather_sequence(mine[0], split=split)
            res[case] = {"errs": errs, "roundtrip": bool(torch.equal(back, q))}
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
        # every rank past its last transfer before any tears its pairs down (gloo aborts a
        # process whose peer closes while it still sends or receives)
        dist.barrier()
        dist.destroy_process_group()


# Arguments wrong on rank 1 only, and what every rank's error must say:
# (method, {keyword: value} for rank 1, q/k/v token counts on rank 1, dtype on rank 1, message)
BAD = [
    ("all_gather", {}, (8, 4, 8), "float32", "rank 1: q, k, v: 8, 4 and 8 tokens"),
    ("all_gather", {"split": "zigzag"}, (7, 7, 7), "float32", "two equal chunks"),
    ("all_gather", {"window_size": (-2, 2)}, (8, 8, 8), "float32", "rank 1: window_size"),
    ("all_gather", {"causal": True}, (8, 8, 8), "float32", "rank 1's causal is True but"),
    ("ring", {"alibi_slopes": torch.ones(2)}, (8, 8, 8), "float32", "ALiBi are not supported"),
    ("ring", {"softcap": "x"}, (8, 8, 8), "float32", "rank 1: ValueError"),
    ("ring", {}, (6, 6, 6), "float32", "rank 1's q shape is (1, 6, 2, 4) but rank 0's is"),
    ("ring", {}, (8, 8, 8), "float64", "rank 1: q: expected a 4-D"),
    ("ring", {"split": "ring"}, (8, 8, 8), "float32", "rank 1: split: 'ring'"),
]


def _bad_worker(rank, world, port, outdir):
    from flashattn import parallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    errors = []
    try:
        for method, kw, tokens, dtype, _ in BAD:
            if rank != 1:
                kw, tokens, dtype = {}, (8, 8, 8), "float32"
            x = [torch.zeros(1, n, 2, 4, dtype=getattr(torch, dtype)) for n in tokens]
            try:
                getattr(parallel, method + "_attention")(*x, **kw)
                errors.append("no error")
            except Exception as e:  # every rank must get here, in step
                errors.append(f"{type(e).__name__}: {e}")
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(errors, f)
        # every rank past its last transfer before any tears its pairs down (gloo aborts a
        # process whose peer closes while it still sends or receives)
        dist.barrier()
        dist.destroy_process_group()


def _run(world, tmp_path, dtype="float32"):
    mp.start_processes(_worker, args=(world, free_port(), str(tmp_path), dtype),
                       nprocs=world, join=True, start_method="spawn")
    return [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_one_process(world, tmp_path):
    for rank, res in enumerate(_run(world, tmp_path)):
        for case in CASES:
            r = res[case]
            assert r["roundtrip"], f"rank {rank} {case}: gather_sequence(split_sequence(x)) != x"
            for name, e in zip(("out", "dq", "dk", "dv"), r["errs"]):
                assert e <= 1e-5, f"world {world} rank {rank} {case} {name}: rel err {e:.2e}"


def test_bf16(tmp_path):
    """bf16, flash-attn's rule: each rank's output and gradients no farther from the fp32
    result than twice bf16 flash_attn_func over the whole sequence is (plus one bf16 ulp: each
    rank's part of dK and dV is rounded to bf16 before their sum); and the output at most one
    bf16 ulp from the whole-sequence output."""
    for rank, res in enumerate(_run(2, tmp_path, dtype="bfloat16")):
        for case in CASES:
            r = res[case]
            for name, e, w in zip(("out", "dq", "dk", "dv"), r["split"], r["whole"]):
                assert e <= 2 * w + 2 ** -8, f"rank {rank} {case} {name}: {e:.2e} vs {w:.2e}"
            # partial outputs merged unrounded (ring: fp32 out from the kernel): the output is
            # the whole-sequence one to within its own rounding
            assert r["ulps"] <= 1, f"rank {rank} {case}: out {r['ulps']} ulps from the whole's"


def test_wrong_rank_fails_everywhere(tmp_path):
    """Arguments wrong or different on one rank fail every rank with one message naming that
    rank, and the ranks stay in step for the next call (never a hang)."""
    mp.start_processes(_bad_worker, args=(3, free_port(), str(tmp_path)), nprocs=3, join=True,
                       start_method="spawn")
    for rank in range(3):
        errors = json.load(open(tmp_path / f"rank{rank}.json"))
        assert len(errors) == len(BAD), (rank, errors)
        for (method, _, _, _, what), err in zip(BAD, errors):
            assert err.startswith(f"FlashAttnValueError: {method}_attention:") and what in err, (
                rank, err)


def test_split_errors():
    from flashattn import parallel

    x = torch.zeros(1, 10, 2, 4)
    # without a process group, a problem with the arguments raises at once
    with pytest.raises(flashattn.FlashAttnError, match="ring_attention: sliding windows"):
        parallel.ring_attention(x, x, x, window_size=(2, 0))
    with pytest.raises(flashattn.FlashAttnError, match="equal zigzag chunks"):
        parallel.split_sequence(x, 0, 3, "zigzag")
    with pytest.raises(flashattn.FlashAttnError, match="split"):
        parallel.split_sequence(x, 0, 2, "ring")
