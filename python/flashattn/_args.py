"""Type and range checks for the scalar arguments of every public function.

Each value ends in a C field of fixed width (int32 windows and split counts, int64 sequence
lengths, fp32 scales), where ctypes would silently truncate or round it: window_size=(2**40, 0)
would run as (0, 0), max_seqlen=2**64 + 5 as 5, softmax_scale=1e-300 as the default scale. So
each is checked here against its field, before any call, and refused with a message naming the
argument and the allowed range. Integers are what flash-attn takes where it takes integers
(Python and NumPy integers, anything with __index__; not bool, not float); booleans are bool,
numpy.bool_ or the integers 0 and 1. A value out of range raises FlashAttnValueError with
status_name "FA_ERR_VALUE", as the library would; a value of the wrong type FlashAttnTypeError.
"""

import math
import numbers
import operator

import numpy as np

from ._lib import FlashAttnTypeError, FlashAttnValueError

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1

# Where fp32 rounding (to nearest, ties to even) of a double ends: |x| <= F32_ZERO gives 0,
# |x| >= F32_INF gives inf, x >= P_MAX gives 1 (for x < 1).
F32_ZERO = 2.0 ** -150
F32_INF = 2.0 ** 128 - 2.0 ** 103
P_MAX = 1.0 - 2.0 ** -25


def _value_error(message):
    return FlashAttnValueError(f"flashattn: FA_ERR_VALUE: {message}", status=-7,
                               status_name="FA_ERR_VALUE")


def _show(x):
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def integer(name, x, lo, hi, note=""):
    """x as an int in [lo, hi]; TypeError for a non-integer, ValueError outside the range."""
    if type(x) is not int:  # (the common case costs one test)
        if isinstance(x, (bool, np.bool_)):
            raise FlashAttnTypeError(f"{name}: expected an integer; got bool {x!r}")
        try:
            x = operator.index(x)
        except TypeError:
            raise FlashAttnTypeError(f"{name}: expected an integer; got {type(x).__name__} "
                                     f"{_show(x)}") from None
    if not lo <= x <= hi:
        raise _value_error(f"{name} is {x}; expected an integer in [{lo}, {hi}]{note}")
    return x


def boolean(name, x):
    """x as a bool: True/False, numpy.bool_, or the integers 0 and 1."""
    if x is True or x is False:
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    if not isinstance(x, bool) and isinstance(x, numbers.Integral) and x in (0, 1):
        return bool(x)
    raise FlashAttnTypeError(f"{name}: expected a bool; got {type(x).__name__} {_show(x)}")


def real(name, x):
    """x as a Python float; TypeError for anything but a real number (bool included)."""
    if type(x) is float:
        return x
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise FlashAttnTypeError(f"{name}: expected a real number; got {type(x).__name__} "
                                 f"{_show(x)}")
    return float(x)


def _fp32_field(name, x, what):
    """A nonzero finite x whose fp32 value is neither 0 nor infinite."""
    a = abs(x)
    if a <= F32_ZERO or a >= F32_INF:
        raise _value_error(
            f"{name} is {x!r}, which is {'0' if a <= F32_ZERO else 'infinite'} in fp32 (the "
            f"scores are computed in fp32); expected {what} with magnitude in [1.4e-45, 3.4e38]")


def softmax_scale(x, name="softmax_scale"):
    """None (the default 1/sqrt(headdim)) or a finite real that fp32 holds: 0 stays 0 (uniform
    probabilities), any other value must not round to 0 or overflow in fp32."""
    if x is None:
        return None
    x = real(name, x)
    if not math.isfinite(x):
        raise _value_error(f"{name} is {x!r}; expected a finite number (None: 1/sqrt(headdim))")
    if x != 0.0:
        _fp32_field(name, x, "0 or a number")
    return x


def softcap(x, name="softcap"):
    """A real; <= 0 means off (flash-attn's convention), a positive value must be finite and
    not round to 0 in fp32."""
    x = real(name, x)
    if math.isnan(x) or x == math.inf:
        raise _value_error(f"{name} is {x!r}; expected a finite number (<= 0: off)")
    if x > 0.0:
        _fp32_field(name, x, "<= 0 (off) or a number")
    return x


def dropout_p(x, name="dropout_p"):
    """A probability in [0, 1) that stays below 1 in fp32."""
    x = real(name, x)
    if not 0.0 <= x < P_MAX:
        raise _value_error(f"{name} is {x!r}; expected a probability in [0, 1) (below 1 in "
                           f"fp32, which rounds 1 - 3e-8 up to 1)")
    return x


def window_side(x, name):
    """One side of a window: an int32; any negative value means unbounded (returned as -1)."""
    x = integer(name, x, INT32_MIN, INT32_MAX, " (negative: unbounded)")
    return -1 if x < 0 else x


def window(pair, name="window_size"):
    """window_size = (left, right) → (left, right) with -1 for unbounded sides."""
    try:
        n = len(pair)
    except TypeError:
        n = None
    if n != 2 or isinstance(pair, (str, bytes)):
        raise FlashAttnTypeError(f"{name}: expected a pair (left, right) of integers; got "
                                 f"{type(pair).__name__} {_show(pair)}")
    return window_side(pair[0], f"{name}[0]"), window_side(pair[1], f"{name}[1]")


def seqlen(x, name):
    """A sequence length or bound (max_seqlen, cache_seqlens as one number): an int64 >= 0."""
    return integer(name, x, 0, INT64_MAX)


def attention(dropout_p_, softmax_scale_, causal, softcap_):
    """The scalars every attention call shares, checked: (dropout_p, softmax_scale, causal,
    softcap)."""
    return (dropout_p(dropout_p_), softmax_scale(softmax_scale_), boolean("causal", causal),
            softcap(softcap_))


def sinks(learnable_sink, s_aux):
    """The attention sinks of a public call: learnable_sink (flash-attn's name) or s_aux (vLLM's
    and transformers'), at most one of them; None without sinks. The caller checks the type."""
    if learnable_sink is not None and s_aux is not None:
        raise _value_error("learnable_sink and s_aux name the same sinks; pass one")
    return learnable_sink if learnable_sink is not None else s_aux
