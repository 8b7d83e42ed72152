"""Speed paths of Attention's _HostAttention and LSTM's chunked projection against float64
references written here.

_HostAttention writes the unnormalised E @ V of every block straight into Y (a strided
4-D view when a block holds several query heads of one KV head and only some of the
rows) and the row sums into one array, then checks all of them at once, redoes only the
blocks that need the max shift, and divides Y by the sums in one pass.

LSTM's _ChunkedProjection hands the recurrence step-major (steps, 4H, N) chunks with the
bias added, the first chunks ramping up 1, 2, 3, 4, 6, ... steps (_chunk_bounds).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn import _lstm_host
from gpukernels.kernels.nn import attention as attention_mod
from gpukernels.kernels.nn import recurrent
from gpukernels.kernels.nn.attention import Attention
from gpukernels.kernels.nn.recurrent import LSTM

# these tests check the host specialisations themselves
pytestmark = pytest.mark.usefixtures("default_paths")

# ---------------------------------------------------------------------------- Attention


def attention64(Q, K, V, past_k=None, past_v=None, causal=0, scale=None):
    """float64 Y, one (batch, query head) at a time, stable softmax; 4-D inputs.  The
    causal frontier: query i sees key j iff j <= i + past length."""
    Q, K, V = (np.asarray(a, np.float64) for a in (Q, K, V))
    P = 0 if past_k is None else past_k.shape[2]
    if past_k is not None:
        K = np.concatenate([np.asarray(past_k, np.float64), K], 2)
        V = np.concatenate([np.asarray(past_v, np.float64), V], 2)
    B, Hq, Sq, D = Q.shape
    Hkv, T = K.shape[1], K.shape[2]
    G = Hq // Hkv
    sc = 1 / np.sqrt(D) if scale is None else scale
    Y = np.zeros((B, Hq, Sq, V.shape[3]))
    for b in range(B):
        for hq in range(Hq):
            s = Q[b, hq] @ K[b, hq // G].T * sc
            if causal:
                i = np.arange(Sq)[:, None] + P
                s = np.where(np.arange(T)[None, :] <= i, s, -np.inf)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            Y[b, hq] = (e / e.sum(axis=1, keepdims=True)) @ V[b, hq // G]
    return Y


@pytest.fixture
def fast_runs(monkeypatch):
    """Counts _HostAttention.run calls and the blocks redone with the max shift."""
    counts = {"run": 0, "shifted": 0}
    run, shifted = attention_mod._HostAttention.run, attention_mod._HostAttention._shifted_block

    def counted_run(self, *args):
        counts["run"] += 1
        return run(self, *args)

    def counted_shifted(self, *args):
        counts["shifted"] += 1
        return shifted(self, *args)

    monkeypatch.setattr(attention_mod._HostAttention, "run", counted_run)
    monkeypatch.setattr(attention_mod._HostAttention, "_shifted_block", counted_shifted)
    return counts


def att():
    k = Attention(KernelContext("cpu", 23))
    k.requested_outputs = (True,)
    return k


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("block_bytes", [1 << 20, 3000, 700])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize("causal,rows", [(0, 0), (1, 3), (1, 4)])
@pytest.mark.parametrize("sq,skv", [(11, 11), (9, 17), (16, 5)])
def test_deferred_normalisation(rng, monkeypatch, fast_runs, block_bytes, hq, hkv, causal, rows, sq, skv):
    """Blocks of whole and partial heads and rows (strided views of Y and of the row sums)."""
    monkeypatch.setattr(attention_mod, "_HOST_BLOCK_BYTES", block_bytes)
    if rows:
        monkeypatch.setattr(attention_mod, "_HOST_CAUSAL_ROWS", rows)
    Q, K, V = rand(rng, 2, hq, sq, 8), rand(rng, 2, hkv, skv, 8), rand(rng, 2, hkv, skv, 5)
    got = att()(Q, K, V, is_causal=causal).Y.numpy()
    assert fast_runs["run"] == 1 and fast_runs["shifted"] == 0
    np.testing.assert_allclose(got, attention64(Q, K, V, causal=causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
def test_only_failing_blocks_redone(rng, monkeypatch, fast_runs, causal):
    """One block's 2**s overflows: that block alone is redone with the shift, the others
    keep their unshifted sums, and all rows are normalised."""
    monkeypatch.setattr(attention_mod, "_HOST_BLOCK_BYTES", 2 * 4 * 12 * 4)  # 2 heads x 4 rows x 12 keys
    monkeypatch.setattr(attention_mod, "_HOST_CAUSAL_ROWS", 4)
    Q, K, V = rand(rng, 1, 6, 12, 8), rand(rng, 1, 3, 12, 8), rand(rng, 1, 3, 12, 4)
    Q[0, 3, 4:8] *= 80  # KV head 1, second row block
    got = att()(Q, K, V, is_causal=causal).Y.numpy()
    assert fast_runs["shifted"] == 1
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, attention64(Q, K, V, causal=causal), rtol=1e-4, atol=1e-5)


def test_underflow_and_large_v_blocks(rng, monkeypatch, fast_runs):
    """Row sums that underflow (scores far below 0) and E @ V that overflows (huge V), each
    in its own batch entry: both redone, the rest kept."""
    monkeypatch.setattr(attention_mod, "_HOST_BLOCK_BYTES", 1 << 20)
    Q, K, V = rand(rng, 3, 2, 7, 4), rand(rng, 3, 2, 7, 4), rand(rng, 3, 2, 7, 3)
    K[0] = -np.abs(K[0])
    Q[0] = np.abs(Q[0]) * 70
    Q[2] *= 3  # 2**s up to about 2**9: E @ V of V ~ 1e36 overflows, the shifted one does not
    V[2] *= np.float32(1e36)
    got = att()(Q, K, V).Y.numpy()
    assert fast_runs["shifted"] == 2
    np.testing.assert_allclose(got, attention64(Q, K, V), rtol=1e-4, atol=1e-6)


def test_nan_row_stays_in_its_row(rng, fast_runs):
    Q, K, V = rand(rng, 1, 3, 6, 4), rand(rng, 1, 3, 6, 4), rand(rng, 1, 3, 6, 2)
    Q[0, 2, 4, 1] = np.nan
    got = att()(Q, K, V).Y.numpy()
    assert np.all(np.isnan(got[0, 2, 4]))
    mask = np.ones(got.shape, bool)
    mask[0, 2, 4] = False
    np.testing.assert_allclose(got[mask], attention64(Q, K, V)[mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hq,hkv,sq", [(8, 2, 1), (8, 1, 1), (4, 2, 2), (9, 3, 3)])
@pytest.mark.parametrize("block_bytes", [1 << 20, 600])
def test_decode_rows(rng, monkeypatch, fast_runs, hq, hkv, sq, block_bytes):
    """Few query rows per KV head (K @ q^T) with a past cache, one or several head blocks."""
    monkeypatch.setattr(attention_mod, "_HOST_BLOCK_BYTES", block_bytes)
    P = 13
    Q, K, V = rand(rng, 2, hq, sq, 16), rand(rng, 2, hkv, sq, 16), rand(rng, 2, hkv, sq, 6)
    pk, pv = rand(rng, 2, hkv, P, 16), rand(rng, 2, hkv, P, 6)
    got = att()(Q, K, V, None, pk, pv, is_causal=1).Y.numpy()
    assert fast_runs["run"] == 1
    np.testing.assert_allclose(got, attention64(Q, K, V, pk, pv, causal=1), rtol=1e-5, atol=1e-5)


def test_float64_inputs(rng, monkeypatch, fast_runs):
    monkeypatch.setattr(attention_mod, "_HOST_BLOCK_BYTES", 2000)
    Q, K, V = (rng.standard_normal((2, 4, 10, 6)) for _ in range(3))
    got = att()(Q, K, V, is_causal=1).Y.numpy()
    assert got.dtype == np.float64 and fast_runs["run"] == 1
    np.testing.assert_allclose(got, attention64(Q, K, V, causal=1), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- LSTM


def lstm64(X, W, R, B=None, h0=None, c0=None, reverse=False):
    """float64 Y (S, N, H), Y_h and Y_c (N, H) of one direction, default activations."""
    X, W, R = (np.asarray(a, np.float64) for a in (X, W, R))
    S, N, _ = X.shape
    H = R.shape[1]
    bias = np.zeros(4 * H) if B is None else np.asarray(B[:4 * H], np.float64) + np.asarray(B[4 * H:], np.float64)
    h = np.zeros((N, H)) if h0 is None else np.asarray(h0, np.float64)
    c = np.zeros((N, H)) if c0 is None else np.asarray(c0, np.float64)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    Y = np.zeros((S, N, H))
    for t in (range(S - 1, -1, -1) if reverse else range(S)):
        a = X[t] @ W.T + h @ R.T + bias
        i, o, f, g = sig(a[:, :H]), sig(a[:, H:2 * H]), sig(a[:, 2 * H:3 * H]), np.tanh(a[:, 3 * H:])
        c = f * c + i * g
        h = o * np.tanh(c)
        Y[t] = h
    return Y, h, c


@pytest.mark.parametrize("S,T", [(1, 4), (2, 4), (3, 4), (7, 4), (8, 4), (16, 4), (21, 4), (40, 8), (5, 1)])
@pytest.mark.parametrize("reverse", [False, True])
def test_chunk_bounds(S, T, reverse):
    bounds = _lstm_host._chunk_bounds(S, T, reverse)
    sizes = [b - a for a, b in bounds]
    assert all(0 < n <= T for n in sizes) and sum(sizes) == S
    ramp, size = [], 1
    for _ in sizes:
        ramp.append(min(T, size))
        size += max(1, size // 2)
    assert ramp[:4] == [min(T, n) for n in (1, 2, 3, 4)][:len(ramp)]
    assert sizes[:-1] == ramp[:-1] and sizes[-1] <= ramp[-1]
    steps = [t for a, b in bounds for t in (range(b - 1, a - 1, -1) if reverse else range(a, b))]
    assert steps == (list(range(S - 1, -1, -1)) if reverse else list(range(S)))


HID = 96  # with a batch of 32: a blocked step product, chunks of 4 steps


@pytest.mark.parametrize("S", [8, 9, 15, 16, 23])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_chunked_projection(rng, monkeypatch, S, direction, bias):
    chunks = []
    project = _lstm_host._ChunkedProjection._project

    def counted(self, k):
        out = project(self, k)
        t0, t1 = self.bounds[k]
        assert out.shape == (t1 - t0, self.M, self.N) and out.flags.c_contiguous
        chunks.append(k)
        return out

    monkeypatch.setattr(_lstm_host._ChunkedProjection, "_project", counted)
    N, I, D = 32, 20, 2 if direction == "bidirectional" else 1
    X = rand(rng, S, N, I)
    W, R = rand(rng, D, 4 * HID, I) * 0.3, rand(rng, D, 4 * HID, HID) * 0.3
    B = rand(rng, D, 8 * HID) * 0.3 if bias else None
    h0, c0 = rand(rng, D, N, HID), rand(rng, D, N, HID)
    res = LSTM(KernelContext("cpu"))(X, W, R, B, None, h0, c0, direction=direction, hidden_size=HID)
    assert chunks  # the chunked path ran
    for d in range(D):
        Y, Yh, Yc = lstm64(X, W[d], R[d], None if B is None else B[d], h0[d], c0[d],
                           reverse=direction == "reverse" or d == 1)
        np.testing.assert_allclose(res.Y.numpy()[:, d], Y, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(res.Y_h.numpy()[d], Yh, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(res.Y_c.numpy()[d], Yc, rtol=2e-5, atol=2e-5)


def test_lstm_padded_rows_layout1(rng):
    """A hidden size whose blocked product pads rows; layout 1; only Y_h wanted."""
    S, N, I, H = 19, 64, 9, 67
    X = rand(rng, N, S, I)
    W, R, B = rand(rng, 1, 4 * H, I) * 0.3, rand(rng, 1, 4 * H, H) * 0.3, rand(rng, 1, 8 * H) * 0.3
    assert recurrent._StepProduct(np, R[0], N).blocks is not None
    k = LSTM(KernelContext("cpu"))
    k.requested_outputs = (False, True, False)
    res = k(X, W, R, B, hidden_size=H, layout=1)
    _, Yh, _ = lstm64(X.transpose(1, 0, 2), W[0], R[0], B[0])
    np.testing.assert_allclose(res.Y_h.numpy()[:, 0], Yh, rtol=2e-5, atol=2e-5)


def test_lstm_sequence_lens_full_projection(rng):
    """Sequence lengths take the one-chunk projection (_FullProjection bounds)."""
    S, N, I = 12, 32, 10
    X = rand(rng, S, N, I)
    W, R, B = rand(rng, 1, 4 * HID, I) * 0.3, rand(rng, 1, 4 * HID, HID) * 0.3, rand(rng, 1, 8 * HID) * 0.3
    lens = rng.integers(1, S + 1, N).astype(np.int32)
    res = LSTM(KernelContext("cpu"))(X, W, R, B, lens, hidden_size=HID)
    for n in range(N):
        L = int(lens[n])
        Y, Yh, Yc = lstm64(X[:L, n:n + 1], W[0], R[0], B[0])
        np.testing.assert_allclose(res.Y.numpy()[:L, 0, n], Y[:, 0], rtol=2e-5, atol=2e-5)
        assert np.all(res.Y.numpy()[L:, 0, n] == 0)
        np.testing.assert_allclose(res.Y_h.numpy()[0, n], Yh[0], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(res.Y_c.numpy()[0, n], Yc[0], rtol=2e-5, atol=2e-5)
