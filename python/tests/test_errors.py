"""Error paths: the library's status codes surface as Python exceptions (ValueError, TypeError,
RuntimeError, NotImplementedError as fits) carrying the library's message, and nothing crashes."""

import os
import subprocess
import sys

import numpy as np
import pytest

import flashattn
from flashattn import (
    FlashAttnError,
    FlashAttnTypeError,
    FlashAttnValueError,
    flash_attn_func,
    flash_attn_varlen_func,
)


def _qkv(B=1, Sq=4, Sk=4, H=2, Hk=2, D=8, dtype=np.float32):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((B, Sq, H, D)).astype(dtype),
            rng.standard_normal((B, Sk, Hk, D)).astype(dtype),
            rng.standard_normal((B, Sk, Hk, D)).astype(dtype))


def test_gqa_heads_must_divide():
    q, k, v = _qkv(H=8, Hk=3)
    with pytest.raises(ValueError) as e:
        flash_attn_func(q, k, v)
    assert isinstance(e.value, FlashAttnError) and isinstance(e.value, FlashAttnValueError)
    assert e.value.status_name == "FA_ERR_SHAPE" and e.value.status == -3
    # The library's own message, naming the argument and the expected value.
    assert "k: shape[2] (KV heads) is 3, which does not divide q's 8 heads" in str(e.value)


def test_shape_mismatch():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="FA_ERR_SHAPE"):
        flash_attn_func(q, k, v[:, :3])


def test_head_dim_limits():
    q, k, v = _qkv(D=257)
    with pytest.raises(ValueError, match="FA_ERR_UNSUPPORTED.*head dim"):
        flash_attn_func(q, k, v)
    q, k, v = _qkv(D=0)
    with pytest.raises(ValueError, match="FA_ERR_SHAPE"):
        flash_attn_func(q, k, v)


def test_dtypes():
    q, k, v = _qkv(dtype=np.float64)
    with pytest.raises(TypeError, match="float64 is not supported.*cast to float32"):
        flash_attn_func(q, k, v)
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="FA_ERR_DTYPE") as e:
        flash_attn_func(q, k.astype(np.float16), v)
    assert isinstance(e.value, FlashAttnTypeError)
    with pytest.raises(TypeError, match="int64 is not supported"):
        flash_attn_func(q.astype(np.int64), k, v)


def test_not_an_array():
    q, k, v = _qkv()
    with pytest.raises(TypeError):
        flash_attn_func(q.tolist(), k, v)
    with pytest.raises(TypeError, match="k: expected a numpy.ndarray"):
        flash_attn_func(q, k.tolist(), v)


def test_rank():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="q: expected a 4-D array"):
        flash_attn_func(q[0], k, v)


def test_values():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="FA_ERR_VALUE.*dropout_p"):
        flash_attn_func(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="FA_ERR_VALUE.*softmax_scale"):
        flash_attn_func(q, k, v, softmax_scale=float("inf"))
    with pytest.raises(ValueError, match="FA_ERR_VALUE.*softcap"):
        flash_attn_func(q, k, v, softcap=float("nan"))


def test_alibi_errors():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="alibi_slopes: dtype float64"):
        flash_attn_func(q, k, v, alibi_slopes=np.ones(2))
    with pytest.raises(ValueError, match="alibi"):
        flash_attn_func(q, k, v, alibi_slopes=np.ones(3, np.float32))


def test_varlen_errors():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((10, 2, 8)).astype(np.float32)
    cu = np.array([0, 4, 10], np.int32)
    # an index argument names int32 (not the float dtypes) and the cast
    with pytest.raises(TypeError, match=r"cu_seqlens_q: dtype int64 is not supported; expected "
                                        r"int32 \(.*cu_seqlens_q\.astype\(np\.int32\)"):
        flash_attn_varlen_func(q, q, q, cu.astype(np.int64), cu, 6, 6)
    with pytest.raises(TypeError, match="cu_seqlens_k: dtype float64 is not supported; expected "
                                        "int32$"):
        flash_attn_varlen_func(q, q, q, cu, cu.astype(np.float64), 6, 6)
    with pytest.raises(ValueError, match="FA_ERR_VALUE.*cu_seqlens_q decreases"):
        flash_attn_varlen_func(q, q, q, np.array([0, 6, 4], np.int32), cu, 6, 6)
    with pytest.raises(ValueError, match="FA_ERR_VALUE.*beyond"):
        flash_attn_varlen_func(q, q, q, np.array([0, 4, 11], np.int32), cu, 7, 6)
    with pytest.raises(ValueError, match="FA_ERR_VALUE.*max"):
        flash_attn_varlen_func(q, q, q, cu, cu, 3, 6)  # a sequence longer than max_seqlen_q


def test_nothing_written_on_error_and_next_call_works():
    q, k, v = _qkv(H=4, Hk=3)
    with pytest.raises(ValueError):
        flash_attn_func(q, k, v)
    q, k, v = _qkv()
    assert np.isfinite(flash_attn_func(q, k, v)).all()


def test_block_table_needs_no_dropout_and_private_extras_are_refused():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 2, 8)).astype(np.float32)
    pages = rng.standard_normal((2, 4, 2, 8)).astype(np.float32)
    cu = np.array([0, 4], np.int32)
    table = np.array([[1]], np.int32)
    with pytest.raises(ValueError, match="dropout"):
        flash_attn_varlen_func(q, pages, pages, cu, cu, 4, 4, dropout_p=0.5, block_table=table)
    from flashattn.flash_attn_interface import _flash_attn_varlen_forward

    with pytest.raises(NotImplementedError, match="seqused_k"):
        _flash_attn_varlen_forward(q, q, q, cu, cu, 4, 4, 0.0, None, False,
                                   seqused_k=np.array([4], np.int32))


def test_bad_library_path_is_a_clear_import_error():
    env = dict(os.environ, FLASHATTN_LIBRARY="/nonexistent/libflashattn.so")
    code = ("import numpy as np, flashattn\n"
            "try:\n"
            "    flashattn.flash_attn_func(*(np.zeros((1, 2, 1, 4), np.float32),) * 3)\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ImportError: flashattn: cannot load libflashattn from FLASHATTN_LIBRARY" in r.stdout
    assert "/nonexistent/libflashattn.so" in r.stdout
