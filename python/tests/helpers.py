"""Test helpers: dtypes, tolerances, random inputs, comparisons against the fp64 reference, a
free port for process groups."""

import hashlib
import importlib.util
import os
import secrets
import socket

import numpy as np

from flashattn import _core

# This run's seed: fresh unless FA_TEST_SEED gives one (the C tests' variable), so each run draws
# new inputs and a failure can be replayed; pytest prints it in its header and after failures.
SEED = int(os.environ["FA_TEST_SEED"], 0) if os.environ.get("FA_TEST_SEED") else secrets.randbits(32)


def seeded(key):
    """A 64-bit seed for key (an int, or a string such as a test's id) in this run: the same key
    gives the same seed within a run (two draws meant to match stay matched), a new run new ones;
    every bit depends on both, so any slice of it (np.random.seed takes 32) is fresh too."""
    digest = hashlib.blake2b(f"{SEED}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_bench(name):
    """bench/<name>.py of this tree as a module (the bench scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BF16 = _core._NP_BF16  # None without ml_dtypes

# The dtypes the NumPy path takes, each with its error bound relative to max(1, max |ref|).
# Accumulation is fp32 throughout, so these are the inputs'/outputs' rounding plus margin.
DTYPES = [np.dtype(np.float32), np.dtype(np.float16)] + ([BF16] if BF16 is not None else [])
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def dtype_ids(dts):
    return [d.name for d in dts]


def randn(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def rel_err(a, ref):
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert a.shape == ref.shape, (a.shape, ref.shape)
    if ref.size == 0:
        return 0.0
    assert not np.isnan(a).any(), "NaN in result"
    return float(np.max(np.abs(a - ref))) / max(1.0, float(np.max(np.abs(ref))))


def assert_close(a, ref, dtype, name="", factor=1.0):
    tol = TOL[np.dtype(dtype).name] * factor
    e = rel_err(a, ref)
    assert e <= tol, f"{name}: max rel err {e:.2e} > {tol:.1e} ({np.dtype(dtype).name})"


def assert_lse(lse, ref):
    """lse matches where finite and is -inf exactly where the reference is (no visible key)."""
    lse = np.asarray(lse, dtype=np.float64)
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(lse), fin), "lse finiteness differs from the reference"
    assert np.all(lse[~fin] == -np.inf), "a fully masked row's lse must be -inf"
    if fin.any():
        assert np.max(np.abs(lse[fin] - ref[fin])) <= 2e-5 * max(1.0, np.max(np.abs(ref[fin])))


def free_port():
    """A TCP port on 127.0.0.1 free right now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rotary_tables(rng, seqlen, rd, dtype):
    """cos and sin tables (seqlen, rd / 2) of random angles, in dtype."""
    ang = rng.uniform(0, 2 * np.pi, (seqlen, rd // 2))
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def kvcache_options(rng, o, kw, B, S_new, H, Hk, D, dtype, capacity, lens):
    """A flash_attn_with_kvcache case's optional arguments into kw, from its options o: new
    keys and values (S_new > 0), rotary tables (o["rotary"]: rotary_dim), cache_batch_idx,
    cache_leftpad (a third of each cache length) and ALiBi slopes."""
    if S_new:
        kw["k"] = randn(rng, (B, S_new, Hk, D), dtype)
        kw["v"] = randn(rng, (B, S_new, Hk, D), dtype)
    if o.get("rotary"):
        kw["rotary_cos"], kw["rotary_sin"] = rotary_tables(rng, capacity, o["rotary"], dtype)
        kw["rotary_interleaved"] = o.get("rotary_interleaved", True)
    if o.get("batch_idx"):
        kw["cache_batch_idx"] = rng.permutation(B + 1)[:B].astype(np.int32)
    if o.get("leftpad"):
        kw["cache_leftpad"] = (lens // 3).astype(np.int32)
    if o.get("alibi"):
        kw["alibi_slopes"] = rng.uniform(0.05, 0.5, (B, H)).astype(np.float32)
