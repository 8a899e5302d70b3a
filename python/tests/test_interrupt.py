"""Ctrl-C stops a long flashattn call: a subprocess runs a call long enough to time, gets SIGINT
at a tenth of the call's uncancelled time and must raise KeyboardInterrupt well before the call
would have ended (under half its time: relative, so a slow or loaded machine does not make it
flaky); the next call in that process gives the same result as before. The time from the
signal to the KeyboardInterrupt is printed (pytest -s shows it). Short calls (below
_lib.INTERRUPTIBLE_WORK) do not pay for a helper thread."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import flashattn
from flashattn import _lib

# The child: doubles S until one call takes CALL_SECONDS, prints that time, then "started" and
# the same call again, which the parent interrupts; then checks the next call's result.
_CHILD = r"""
import sys, time
import numpy as np
import flashattn
from flashattn.flash_attn_interface import _flash_attn_backward, _flash_attn_forward
mode = sys.argv[1]
rng = np.random.default_rng(0)

def make(S):
    q, k, v, do = (rng.standard_normal((1, S, 2, 64)).astype(np.float32) for _ in range(4))
    if mode == "forward":
        return lambda: flashattn.flash_attn_func(q, k, v)
    if mode == "kvcache":
        kc = np.concatenate([k] * 4, axis=1)
        return lambda: flashattn.flash_attn_with_kvcache(q, kc, kc.copy())
    if mode == "autograd":
        import torch
        tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
        out = flashattn.flash_attn_func(tq, tk, tv)
        def run():
            tq.grad = None
            out.backward(torch.from_numpy(do), retain_graph=True)
            return tq.grad.numpy().copy()
        return run
    out, lse, _, rs = _flash_attn_forward(q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
    def run():
        dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
        _flash_attn_backward(do, q, k, v, out, lse, dq, dk, dv, 0.0, None, True, -1, -1, 0.0,
                             None, False, rs)
        return dq
    return run

S = 1024
while True:
    call = make(S)
    t0 = time.perf_counter()
    want = call()
    full = time.perf_counter() - t0
    if full >= float(sys.argv[2]) or S >= 65536:
        break
    S *= 2
print("full", S, full, flush=True)
print("started", flush=True)
try:
    call()
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
got = call()
print("same" if np.array_equal(got, want) else "DIFFERENT", flush=True)
"""

CALL_SECONDS = 0.5


def _env():
    env = dict(os.environ, FA_NUM_THREADS="2")  # the backward's tasks: key and query blocks
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__)))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("FLASHATTN_LIBRARY", flashattn.library_path())
    return env


def _interrupt(mode):
    p = subprocess.Popen([sys.executable, "-c", _CHILD, mode, str(CALL_SECONDS)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        first = p.stdout.readline().split()
        assert first and first[0] == "full", (first, p.stderr.read())
        S, full = int(first[1]), float(first[2])
        assert p.stdout.readline().strip() == "started"
        time.sleep(0.1 * full)
        sent = time.perf_counter()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().strip()
        latency = time.perf_counter() - sent
        rest = p.stdout.read()
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    print(f"\n{mode}: S={S}, uncancelled call {full:.3f} s; KeyboardInterrupt {1e3 * latency:.1f} "
          f"ms after SIGINT ({100 * latency / full:.1f}% of the call)")
    assert line == "interrupted", (line, p.stderr.read())
    assert latency < 0.5 * full, (latency, full)
    assert rest.split() == ["same"], rest
    assert p.returncode == 0


@pytest.mark.parametrize("mode", ["forward", "backward", "kvcache"])
def test_ctrl_c_stops_a_long_call(mode):
    _interrupt(mode)


def test_ctrl_c_stops_a_long_autograd_backward():
    pytest.importorskip("torch")
    _interrupt("autograd")


def test_short_calls_stay_on_the_calling_thread(monkeypatch):
    """A decode-size call runs directly (no helper thread); only big ones go through one."""
    started = []
    real = threading.Thread.start

    def start(self):
        started.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 8, 128)).astype(np.float32)
    kc = rng.standard_normal((1, 4096, 8, 128)).astype(np.float32)
    flashattn.flash_attn_with_kvcache(q, kc, kc)
    assert started == []
    monkeypatch.setattr(_lib, "INTERRUPTIBLE_WORK", 1)
    out = flashattn.flash_attn_with_kvcache(q, kc, kc)
    assert started == ["flashattn-call"]
    monkeypatch.setattr(_lib, "INTERRUPTIBLE_WORK", 1 << 62)
    assert np.array_equal(out, flashattn.flash_attn_with_kvcache(q, kc, kc))


def test_an_exception_in_the_wait_cancels_and_propagates(monkeypatch):
    """What Ctrl-C does, without a signal: an exception raised while the main thread waits sets
    the flag, the call stops early and the exception propagates; the next call is right."""
    monkeypatch.setattr(_lib, "INTERRUPTIBLE_WORK", 1)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 4096, 2, 64)).astype(np.float32) for _ in range(3))
    want = flashattn.flash_attn_func(q, k, v)
    real_join = threading.Thread.join
    stopped = []

    def join(self, timeout=None):
        if self.name == "flashattn-call" and timeout is not None:
            raise KeyboardInterrupt
        real_join(self, timeout)
        stopped.append(self.is_alive())

    monkeypatch.setattr(threading.Thread, "join", join)
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        flashattn.flash_attn_func(q, k, v)
    early = time.perf_counter() - t0
    monkeypatch.setattr(threading.Thread, "join", real_join)
    assert stopped == [False]  # joined before the exception left
    t0 = time.perf_counter()
    assert np.array_equal(flashattn.flash_attn_func(q, k, v), want)
    assert early < 0.5 * (time.perf_counter() - t0)
