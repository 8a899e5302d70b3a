"""flashattn.parallel.all_gather_attention_varlen on gloo over loopback: world sizes 2, 3 and 4
(one spawn of 4 processes: 4 on the default group, 3 and 2 on groups of the last ranks),
packed streams whose sequences cross rank boundaries (a length-1 and an empty sequence, leading
and trailing padding, a rank holding no sequence), each rank's output and gradients against one
process running flash_attn_varlen_func on the whole stream (fp32: 1e-5 relative; bf16: within
twice whole-stream bf16's error against fp32): causal and not, causal and non-causal windows,
GQA/MQA, softcap, ALiBi (nheads) and (batch, nheads); a rank with another shape, dtype, option
or cu_seqlens failing every rank with one clear message (never a hang); argument errors."""

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
from flashattn.parallel import all_gather_attention_varlen  # noqa: E402

T_LOCAL = 8
# name: (causal, window_size, softcap, alibi ("h": (H), "bh": (B, H)), H, Hk, layout)
CASES = {
    "causal": (True, (-1, -1), 0.0, None, 4, 2, 0),
    "causal_alibi_bh": (True, (-1, -1), 0.0, "bh", 2, 2, 1),
    "full_softcap": (False, (-1, -1), 3.0, None, 4, 1, 0),
    "full_alibi": (False, (-1, -1), 0.0, "h", 2, 1, 1),
    "causal_window": (True, (5, 0), 0.0, None, 2, 2, 1),
    "causal_window_alibi_softcap": (True, (3, 0), 2.0, "h", 4, 2, 0),
    "window": (False, (3, 2), 0.0, None, 4, 2, 0),
    "window_right_alibi": (False, (-1, 4), 0.0, "bh", 2, 2, 1),
    "window_left": (False, (6, -1), 1.5, None, 2, 1, 1),
}
TIMEOUT_S = 60



def _layout(world, which):
    """cu_seqlens of a stream of world·T_LOCAL tokens. 0: from row 0, lengths 3, 1, 0, 13 (longer
    than a rank), then 5s up to 2 rows of trailing padding. 1: 2 rows of leading padding, 1, 11,
    0, 6, then 5s up to T_LOCAL + 1 rows of trailing padding (the last rank holds no sequence)."""
    T = world * T_LOCAL
    start, head, end = (0, [3, 1, 0, 13], T - 2) if which == 0 else (2, [1, 11, 0, 6],
                                                                     T - T_LOCAL - 1)
    cu = [start]
    for n in head:
        cu.append(min(cu[-1] + n, end))
    while cu[-1] < end:
        cu.append(min(cu[-1] + 5, end))
    return torch.tensor(cu, dtype=torch.int32)


def _inputs(world, dtype, H, Hk, layout):
    g = torch.Generator().manual_seed(2000 + 10 * world + layout)
    T, D = world * T_LOCAL, 16
    q = torch.randn(T, H, D, generator=g).to(dtype)
    k, v = (torch.randn(T, Hk, D, generator=g).to(dtype) for _ in range(2))
    dout = torch.randn(T, H, D, generator=g).to(dtype)
    cu = _layout(world, layout)
    slopes = torch.rand(len(cu) - 1, H, generator=g) * 0.3
    return q, k, v, dout, cu, slopes


def _slopes(slopes, alibi):
    return None if alibi is None else slopes[0] if alibi == "h" else slopes


def _whole(q, k, v, dout, cu, slopes, case):
    causal, window, softcap, alibi = CASES[case][:4]
    x = [t.clone().requires_grad_(True) for t in (q, k, v)]
    m = int((cu[1:] - cu[:-1]).max())
    out = flashattn.flash_attn_varlen_func(*x, cu, cu, m, m, causal=causal, window_size=window,
                                           softcap=softcap, alibi_slopes=_slopes(slopes, alibi))
    out.backward(dout)
    return [out.detach()] + [t.grad for t in x]


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / max(1.0, b.float().abs().max()))


def _call(mine, cu, slopes, case, group, **over):
    causal, window, softcap, alibi = CASES[case][:4]
    kw = dict(causal=causal, window_size=window, softcap=softcap,
              alibi_slopes=_slopes(slopes, alibi), group=group)
    kw.update(over)
    m = int((cu[1:] - cu[:-1]).max())
    x = [t.clone().requires_grad_(True) for t in mine[:3]]
    out = all_gather_attention_varlen(*x, cu, m, **kw)
    out.backward(mine[3])
    return [out.detach()] + [t.grad for t in x]


def _mine(tensors, group):
    from flashattn import parallel

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    return [parallel.split_sequence(t, rank, world, dim=0) for t in tensors]


def _cases(group, dtype):
    res = {}
    for case, (causal, window, softcap, alibi, H, Hk, layout) in CASES.items():
        q, k, v, dout, cu, slopes = _inputs(dist.get_world_size(group), dtype, H, Hk, layout)
        got = _call(_mine((q, k, v, dout), group), cu, slopes, case, group)
        whole = _mine(_whole(q, k, v, dout, cu, slopes, case), group)
        if dtype != torch.float32:  # both against fp32 on the same (rounded) inputs
            ref = _mine(_whole(*(t.float() for t in (q, k, v, dout)), cu, slopes, case), group)
            res[case] = {"split": [_rel(a, b) for a, b in zip(got, ref)],
                         "whole": [_rel(a, b) for a, b in zip(whole, ref)]}
            continue
        res[case] = {"errs": [_rel(a, b) for a, b in zip(got, whole)],
                     "zero": _zero_rows(got, cu, dist.get_rank(group))}
    return res


def _zero_rows(got, cu, rank):
    """Whether out, dq, dk and dv are exactly 0 on this rank's rows in no sequence."""
    pos = torch.arange(rank * T_LOCAL, (rank + 1) * T_LOCAL)
    outside = (pos < int(cu[0])) | (pos >= int(cu[-1]))
    return all(bool((t[outside] == 0).all()) for t in got)


def _mismatches(group):
    """Every rank calls with one thing different on rank 1: each call must fail everywhere."""
    res = {}
    case, world, one = "causal_alibi_bh", dist.get_world_size(group), dist.get_rank(group) == 1
    q, k, v, dout, cu, slopes = _inputs(world, torch.float32, *CASES[case][4:])
    mine = _mine((q, k, v, dout), group)
    cu2 = cu.clone()
    cu2[0] -= 1  # the first sequence one longer (the longest stays)
    odd = {"q shape": dict(mine=[t[:-1] for t in mine]),
           "dtype": dict(mine=[t.to(torch.bfloat16) for t in mine]),
           "causal": dict(over=dict(causal=False)),
           "window_size": dict(over=dict(window_size=(4, 0))),
           "softcap": dict(over=dict(softcap=1.0)),
           "cu_seqlens": dict(cu=cu2),
           "alibi_slopes": dict(slopes=slopes * 2)}
    for name, d in odd.items():
        try:
            _call(d.get("mine", mine) if one else mine, d.get("cu", cu) if one else cu,
                  d.get("slopes", slopes) if one else slopes, case, group,
                  **(d.get("over", {}) if one else {}))
            res[name] = "no error"
        except Exception as e:
            res[name] = f"{type(e).__name__}: {e}"
    # errors found after the check, the same on every rank
    past = torch.tensor([0, world * T_LOCAL + 1], dtype=torch.int32)
    for name, c, m in (("past the end", past, world * T_LOCAL + 1), ("max_seqlen", cu, 1)):
        try:
            all_gather_attention_varlen(*mine[:3], c, m, group=group)
            res[name] = "no error"
        except Exception as e:
            res[name] = f"{type(e).__name__}: {e}"
    # the group still works afterwards
    got = _call(mine, cu, slopes, case, group)
    whole = _mine(_whole(q, k, v, dout, cu, slopes, case), group)
    res["after"] = max(_rel(a, b) for a, b in zip(got, whole))
    return res


# one spawn of 4 processes (starting them is most of the time): world 4 on the default group,
# worlds 3 and 2 on groups of the last ranks (group rank 0 is global rank 1 or 2)
RUNS = [((2, 3), "float32"), ((2, 3), "mismatch"), ((1, 2, 3), "float32"),
        ((1, 2, 3), "bfloat16"), ((0, 1, 2, 3), "float32")]


def _worker(rank, port, outdir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=4, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    res = {}
    try:
        groups = {r: dist.new_group(list(r)) for r in ((2, 3), (1, 2, 3))}  # on every rank
        for ranks, what in RUNS:
            if rank in ranks:
                group = groups.get(ranks)
                res[f"{len(ranks)} {what}"] = (
                    _mismatches(group) if what == "mismatch" else
                    _cases(group, getattr(torch, what)))
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """results(world, what): the group ranks' results, in group rank order."""
    d = tmp_path_factory.mktemp("parallel_varlen")
    mp.start_processes(_worker, args=(free_port(), str(d)), nprocs=4, join=True,
                       start_method="spawn")
    every = [json.load(open(d / f"rank{r}.json")) for r in range(4)]
    return lambda world, what: [every[r][f"{world} {what}"] for r in range(4 - world, 4)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_one_process(world, results):
    for rank, res in enumerate(results(world, "float32")):
        for case in CASES:
            r = res[case]
            assert r["zero"], f"world {world} rank {rank} {case}: padding rows not 0"
            for name, e in zip(("out", "dq", "dk", "dv"), r["errs"]):
                assert e <= 1e-5, f"world {world} rank {rank} {case} {name}: rel err {e:.2e}"


def test_bf16(results):
    """bf16, flash-attn's rule: each rank's output and gradients no farther from the fp32
    result than twice bf16 flash_attn_varlen_func over the whole stream is (plus one bf16 ulp:
    the dK and dV partials a rank sends are rounded to bf16 before their fp32 sum)."""
    for rank, res in enumerate(results(3, "bfloat16")):
        for case in CASES:
            r = res[case]
            for name, e, w in zip(("out", "dq", "dk", "dv"), r["split"], r["whole"]):
                assert e <= 2 * w + 2 ** -8, f"rank {rank} {case} {name}: {e:.2e} vs {w:.2e}"


def test_mismatched_rank_fails_everywhere(results):
    for rank, r in enumerate(results(2, "mismatch")):
        for name in ("q shape", "dtype", "causal", "window_size", "softcap", "cu_seqlens",
                     "alibi_slopes"):
            assert f"rank 1's {name}" in r[name] and "every rank must pass the same" in r[name], (
                rank, name, r[name])
        assert "past the 2 x 8 tokens" in r["past the end"], (rank, r["past the end"])
        assert "max_seqlen 1 < the longest" in r["max_seqlen"], (rank, r["max_seqlen"])
        assert r["after"] <= 1e-5, (rank, r["after"])


def test_split_packed():
    """split_sequence and gather_sequence at dim 0 are the packed stream's split."""
    from flashattn import parallel

    x = torch.arange(24.0).reshape(12, 2)
    assert torch.equal(parallel.split_sequence(x, 1, 3, dim=0), x[4:8])
    with pytest.raises(flashattn.FlashAttnError, match="equal contiguous chunks"):
        parallel.split_sequence(x, 0, 5, dim=0)


def test_argument_errors():
    """Checked before any collective (no process group needed)."""
    f = all_gather_attention_varlen
    x = torch.zeros(8, 2, 4)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    bad = [
        ((x[None], x, x, cu, 8), "3-D"),
        ((x.double(), x, x, cu, 8), "3-D"),
        ((x, x.half(), x.half(), cu, 8), "dtypes"),
        ((x, x[:4], x[:4], cu, 8), "same tokens"),
        ((x, x, x[:, :1], cu, 8), "one shape"),
        ((x[:, :1], x, x, cu, 8), "multiple"),
        ((x, x[..., :2], x[..., :2], cu, 8), "headdim"),
        ((x, x, x, cu.long(), 8), "int32"),
        ((x, x, x, cu[None], 8), "1-D"),
        ((x, x, x, torch.tensor([0, 5, 3], dtype=torch.int32), 8), "nondecreasing"),
        ((x, x, x, torch.tensor([-1, 3], dtype=torch.int32), 8), ">= 0"),
        ((x, x, x, cu, -1), "max_seqlen"),
    ]
    for args, msg in bad:
        with pytest.raises(flashattn.FlashAttnError, match=msg):
            f(*args)
    with pytest.raises(flashattn.FlashAttnError, match="window_size"):
        f(x, x, x, cu, 8, window_size=(-2, 0))
    with pytest.raises(flashattn.FlashAttnError, match="alibi_slopes"):
        f(x, x, x, cu, 8, alibi_slopes=torch.zeros(3))
    with pytest.raises(flashattn.FlashAttnError, match="alibi_slopes"):
        f(x, x, x, cu, 8, alibi_slopes=torch.zeros(2, 2, dtype=torch.float64))
