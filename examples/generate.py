# SPDX-License-Identifier: MIT
"""
generate.py — a tiny decoder-only transformer with random weights that generates tokens with
flashattn.flash_attn_with_kvcache, exactly as one would with flash-attn, and checks every step
against full attention over the whole sequence so far.

    python examples/generate.py [--tokens 256] [--dtype float32|float16]

Per layer and step: project the new token to q, k, v (B, 1, H, D) / (B, 1, Hk, D), apply rotary
through the call, append k/v to the cache in place at cache_seqlens and attend. The check
recomputes the same layer with flash_attn_func(causal=True) over the full (rotated) K/V taken
from the cache, and with plain NumPy fp64 attention; both must agree to within the dtype's
rounding.
"""
import argparse
import sys

import numpy as np

from flashattn import flash_attn_func, flash_attn_with_kvcache


def rotary_tables(seqlen, rotary_dim, base=10000.0):
    inv = 1.0 / base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    ang = np.outer(np.arange(seqlen, dtype=np.float64), inv)  # (seqlen, rotary_dim / 2)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    dt = np.dtype(args.dtype)
    B, H, Hk, D, layers, vocab = 2, 8, 2, 32, 2, 97
    C = H * D
    steps = args.tokens
    rng = np.random.default_rng(args.seed)
    embed = rng.standard_normal((vocab, C)).astype(np.float32) * 0.5
    w_q = [rng.standard_normal((C, H * D)).astype(np.float32) / np.sqrt(C) for _ in range(layers)]
    w_k = [rng.standard_normal((C, Hk * D)).astype(np.float32) / np.sqrt(C) for _ in range(layers)]
    w_v = [rng.standard_normal((C, Hk * D)).astype(np.float32) / np.sqrt(C) for _ in range(layers)]
    w_o = [rng.standard_normal((H * D, C)).astype(np.float32) / np.sqrt(C) for _ in range(layers)]
    unembed = rng.standard_normal((C, vocab)).astype(np.float32) / np.sqrt(C)
    cos, sin = rotary_tables(steps, D)  # rotate every dim; GPT-NeoX pairing below
    cos, sin = cos.astype(dt), sin.astype(dt)

    k_cache = [np.zeros((B, steps, Hk, D), dt) for _ in range(layers)]
    v_cache = [np.zeros((B, steps, Hk, D), dt) for _ in range(layers)]
    cache_seqlens = np.zeros(B, np.int32)
    tokens = rng.integers(0, vocab, size=B)
    generated = [tokens]
    tol = 2e-5 if dt == np.float32 else 2e-3   # vs flash_attn_func over the same cache
    tol64 = 2e-5 if dt == np.float32 else 4e-3  # vs fp64 (fp16 output rounding: 2^-11 relative)
    worst = worst64 = 0.0

    for step in range(steps):
        x = embed[tokens]  # (B, C)
        for l in range(layers):
            q = (x @ w_q[l]).reshape(B, 1, H, D).astype(dt)
            k = (x @ w_k[l]).reshape(B, 1, Hk, D).astype(dt)
            v = (x @ w_v[l]).reshape(B, 1, Hk, D).astype(dt)
            out = flash_attn_with_kvcache(q, k_cache[l], v_cache[l], k=k, v=v,
                                          rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=cache_seqlens, causal=True,
                                          rotary_interleaved=False)
            # check: full causal attention over everything cached so far (rotated in place)
            L = step + 1
            q_rot = rotate_neox(q.astype(np.float32), cos.astype(np.float32), sin.astype(np.float32), step)
            full = flash_attn_func(q_rot.astype(dt), k_cache[l][:, :L], v_cache[l][:, :L],
                                   causal=True)
            err = float(np.max(np.abs(out.astype(np.float64) - full.astype(np.float64))))
            # and an independent NumPy fp64 attention of the new token over the cache
            ref = numpy_attention(q_rot[:, 0], k_cache[l][:, :L], v_cache[l][:, :L])
            err64 = float(np.max(np.abs(out[:, 0].astype(np.float64) - ref)))
            worst = max(worst, err)
            worst64 = max(worst64, err64)
            if not (err <= tol and err64 <= tol64):
                print(f"step {step} layer {l}: |kvcache - full| = {err:.3g} (tol {tol}), "
                      f"|kvcache - fp64| = {err64:.3g} (tol {tol64})", file=sys.stderr)
                return 1
            x = x + out.reshape(B, H * D).astype(np.float32) @ w_o[l]
        cache_seqlens += 1
        tokens = np.argmax(x @ unembed, axis=-1)
        generated.append(tokens)

    seq = np.stack(generated, axis=1)
    print(f"generated {steps} tokens for {B} sequences ({layers} layers, H={H}, Hk={Hk}, D={D}, "
          f"{args.dtype} cache)")
    for b in range(B):
        print(f"  sequence {b}: " + " ".join(str(t) for t in seq[b, :24]) + " ...")
    print(f"every step matched full attention (flash_attn_func): max |difference| {worst:.3g} "
          f"(tolerance {tol})")
    print(f"every step matched NumPy fp64 attention: max |difference| {worst64:.3g} "
          f"(tolerance {tol64})")
    return 0


def numpy_attention(q, k, v):
    """Softmax attention of one query per head, q (B, H, D), over k, v (B, L, Hk, D), in fp64."""
    B, H, D = q.shape
    g = H // k.shape[2]
    kk = np.repeat(k.astype(np.float64), g, axis=2)  # (B, L, H, D)
    vv = np.repeat(v.astype(np.float64), g, axis=2)
    s = np.einsum("bhd,blhd->bhl", q.astype(np.float64), kk) / np.sqrt(D)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhl,blhd->bhd", p, vv)


def rotate_neox(x, cos, sin, pos):
    """GPT-NeoX rotary of x (B, 1, H, D) at position pos, in fp32."""
    half = x.shape[-1] // 2
    c, s = cos[pos], sin[pos]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


if __name__ == "__main__":
    sys.exit(main())
