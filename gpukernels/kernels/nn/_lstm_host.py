"""LSTM's host specialisation ("LSTM.layer", see recurrent.LSTM for the reference).

The recurrence runs in a transposed layout: per step the gates are one (4H, H) x (H, N)
product R @ h^T plus a column block of the input projection W @ X^T; the states are kept
as (H, N) and Y is filled by one transposing copy at the end.  With the default
Sigmoid/Tanh gates and no clip, peephole or input_forget, the i, o, f rows of W, R and B
are pre-halved (exact) so that one tanh over all four gates gives
sigmoid(x) = 0.5 * tanh(x / 2) + 0.5 for three of them and tanh(x) for the fourth.

A small step product runs as single-threaded row blocks (see _StepProduct), and so does
the input projection, chunk by chunk (_ChunkedProjection): for one direction a helper
thread computes it ahead of the recurrence; the two directions of a bidirectional layer
run in two threads.  Nothing then wakes OpenBLAS's thread pool, whose workers spin for a
long while after a threaded product (on a 2-core machine that halves the speed of the
threads that follow)."""

from __future__ import annotations

import threading

import numpy as np

from ...host import tuning
from ...host import host_empty, parallel_ranges
from ..specialize import specialize


def _clip(xp, x, clip):
    """x bounded to [-clip, clip] (as is when clip is None)."""
    return x if clip is None else xp.clip(x, -clip, clip)

# OpenBLAS runs a product of at most about 2**19 multiply-adds in its calling thread (a
# small-matrix kernel) and hands larger ones to its thread pool.  For the many tiny
# products of a recurrence that hand-off costs more than it saves, it stalls for whole
# scheduler slices when the other core is busy, and the pool's workers then spin for
# ~0.1 s; so the host splits a step product into row blocks under that size
# (lstm.small_product, of at least lstm.min_block_rows rows), run by one batched matmul
# call in the calling thread.  The input projection runs in chunks of about
# lstm.projection_cols columns (steps x batch), as products of lstm.sub_cols columns;
# scratch from lstm.pooled_scratch_bytes on comes from the reusable pool (host/tuning.py).


def _scratch(xp, shape, dtype):
    """An uninitialised work array from the host buffer pool (a fresh MiB-sized array
    costs page faults on every call).  Not for the helper thread's chunk buffers: the
    pool's bookkeeping runs in Python, holding the GIL that the recurrence needs between
    its NumPy calls (measured 5-10% slower steps)."""
    return host_empty(shape, dtype, min_bytes=tuning.value("lstm.pooled_scratch_bytes"))


class _StepProduct:
    """out = A @ b for a fixed left operand A (M, K) and right operands b (K, N); out is
    an (Mp, N) buffer reused by every call whose first M rows hold the product (A may be
    padded with zero rows to Mp = blocks * rows)."""

    @staticmethod
    def single_threaded(M, K, N) -> bool:
        """Whether the host runs an (M, K) @ (K, N) step product in the calling thread."""
        small = tuning.value("lstm.small_product")
        return M * K * N <= small or small // max(1, K * N) >= tuning.value("lstm.min_block_rows")

    def __init__(self, xp, A, N):
        self.xp = xp
        M, K = A.shape
        self.M = M
        self.blocks = None
        small = tuning.value("lstm.small_product")
        if M * K * N > small and self.single_threaded(M, K, N):
            rows = small // max(1, K * N)
            nb = -(-M // rows)
            rows = -(-M // nb)
            self.blocks = (nb, rows)
        if self.blocks is None:
            self.A = xp.ascontiguousarray(A)
            self.out = xp.empty((M, N), dtype=A.dtype)
            self.out_b = self.out
        else:
            nb, rows = self.blocks
            if nb * rows == M:  # no padding: the blocks are a view
                Ab = np.ascontiguousarray(A)
            else:
                Ab = np.zeros((nb * rows, K), dtype=A.dtype)
                Ab[:M] = A
            self.A = Ab.reshape(nb, rows, K)
            self.out = np.empty((nb * rows, N), dtype=A.dtype)
            self.out_b = self.out.reshape(nb, rows, N)

    def __call__(self, b):
        self.xp.matmul(self.A, b, out=self.out_b)
        return self.out


def _chunk_bounds(S, T, reverse):
    """The (t0, t1) step ranges of the projection chunks in the order the recurrence reads
    them: chunks of T steps, but the first ones of 1, 2, 3, 5, ... steps (growing by half),
    so that the recurrence starts after a short first product and the helper, not much
    faster per step than the recurrence, gets ahead of it before the chunks reach T."""
    bounds, t, size = [], 0, 1
    while t < S:
        n = min(size, T, S - t)
        bounds.append((t, t + n))
        t += n
        size += max(1, size // 2)
    return [(S - b, S - a) for a, b in bounds] if reverse else bounds


class _FullProjection:
    """Step inputs from the projection of every step computed at once: one chunk, the
    whole (4H, S, N) array, read as (S, 4H, N)."""

    def __init__(self, projT):
        self.bounds = [(0, projT.shape[1])]
        self.arr = projT.transpose(1, 0, 2)

    def chunk(self, k):
        return self.arr

    def output(self, k, job):
        job()

    def finish(self):
        pass


class _SharedTasks:
    """Tasks 0..n-1 (task(k) -> result) that either of two threads may run, each once.
    get(k) runs task k in the calling thread unless the other thread has started it (then
    waits for it); try_run(k) runs it unless it is taken.  A task that raises is left
    to be retried by get()."""

    def __init__(self, n, task):
        self.task = task
        self.lock = threading.Lock()
        self.state = [0] * n  # 0: free, 1: running, 2: done
        self.done = [threading.Event() for _ in range(n)]
        self.results = [None] * n

    def _claim(self, k) -> bool:
        with self.lock:
            free = self.state[k] == 0
            if free:
                self.state[k] = 1
        return free

    def _run(self, k):
        try:
            self.results[k] = self.task(k)
        except BaseException:
            self.state[k] = 0
            self.done[k].set()
            raise
        self.state[k] = 2
        self.done[k].set()

    def try_run(self, k):
        if self._claim(k):
            self._run(k)

    def get(self, k):
        while self.state[k] != 2:
            if self._claim(k):
                self._run(k)
            else:
                self.done[k].wait()
        result, self.results[k] = self.results[k], None
        return result


class _ChunkedProjection:
    """Step inputs W @ x_t^T + bias, (4H, N) per step, computed in chunks of T steps in
    the order the recurrence reads them (see _chunk_bounds), and the copies of finished
    chunks of h into Y.

    A chunk is (4H, I) @ (I, sub * N) products (about lstm.sub_cols columns: a more efficient
    shape than the N columns of a step) in single-threaded row blocks of W, stored
    step-major (T, 4H, N) with the bias added in the same pass, so that the recurrence
    adds a contiguous (4H, N) block per step.  A helper thread runs produce() alongside
    the recurrence: first ahead of it through the projections, then behind it through the
    copies.  The recurrence takes over any task
    the helper has not started, so nothing waits on a helper that does not get to run (and
    without a helper it computes every chunk as it needs it).  Host only."""

    @staticmethod
    def steps_per_chunk(N) -> int:
        return max(1, min(16, tuning.value("lstm.projection_cols") // max(1, N)))

    @staticmethod
    def worth_it(product, p):
        return product.blocks is not None and p["S"] >= 2 * _ChunkedProjection.steps_per_chunk(p["N"])

    def __init__(self, w, bias, xsni, product, reverse, with_outputs):
        S, N, I = xsni.shape
        M = w.shape[0]
        self.T = T = self.steps_per_chunk(N)
        self.sub = max(1, tuning.value("lstm.sub_cols") // max(1, N))  # steps per product inside a chunk
        self.w = np.ascontiguousarray(w)
        self.bias = None if bias is None else bias.reshape(M, 1)
        self.xsni = xsni
        self.S, self.N, self.M = S, N, M
        self.small = tuning.value("lstm.small_product")
        self.min_rows = tuning.value("lstm.min_block_rows")
        self.bounds = _chunk_bounds(S, T, reverse)
        n = len(self.bounds)
        self.inputs = _SharedTasks(n, self._project)
        self.jobs = [None] * n
        self.ready = [threading.Event() for _ in range(n)]
        self.outputs = _SharedTasks(n, lambda k: self.jobs[k]())
        self.with_outputs = with_outputs
        self.stop = False

    def _project(self, k):
        """Chunk k as a contiguous (steps, 4H, N) array."""
        t0, t1 = self.bounds[k]
        steps = t1 - t0
        dst = np.empty((steps, self.M, self.N), dtype=self.w.dtype)
        sub = min(steps, self.sub)
        ns = steps // sub
        self._products(t0, ns, sub, dst[:ns * sub])
        if ns * sub < steps:
            self._products(t0 + ns * sub, 1, steps - ns * sub, dst[ns * sub:])
        return dst

    def _products(self, t0, ns, sub, dst):
        """dst (ns * sub, M, N) = W @ x_t^T (+ bias) for the ns * sub steps from t0: ns
        products of sub steps each (sub * N columns), in single-threaded row blocks."""
        w, M, N = self.w, self.M, self.N
        I = w.shape[1]
        cols = sub * N
        xt = np.empty((ns, I, cols), dtype=w.dtype)  # x^T of each product's steps
        np.copyto(xt, self.xsni[t0:t0 + ns * sub].reshape(ns, cols, I).transpose(0, 2, 1))
        out = np.empty((ns, M, cols), dtype=w.dtype)
        rows = max(self.min_rows, self.small // max(1, I * cols))
        full = (M // rows) * rows
        if full:  # W's row blocks broadcast against the ns right operands
            np.matmul(w[:full].reshape(1, -1, rows, I), xt[:, None],
                      out=out[:, :full].reshape(ns, -1, rows, cols))
        if full < M:
            np.matmul(w[full:], xt, out=out[:, full:])
        src = out.reshape(ns, M, sub, N).transpose(0, 2, 1, 3)  # (ns, sub, M, N)
        d4 = dst.reshape(ns, sub, M, N)
        if self.bias is None:
            np.copyto(d4, src)
        else:
            np.add(src, self.bias.reshape(1, 1, M, 1), out=d4)

    def chunk(self, k):
        return self.inputs.get(k)

    def output(self, k, job):
        """job (writing chunk k's outputs) may run now that chunk k's steps are done."""
        self.jobs[k] = job
        self.ready[k].set()

    def finish(self):
        for k in range(len(self.bounds)):
            if self.jobs[k] is not None:
                self.outputs.get(k)

    def release(self):
        """Drops the tasks, jobs and arrays (the bound methods and closures in them form
        reference cycles that would keep pooled buffers busy until the next GC)."""
        self.inputs = self.outputs = self.jobs = None
        self.w = self.xsni = self.bias = None

    def abandon(self):
        """Called by the recurrence when it ends (normally or not): the helper stops."""
        self.stop = True
        for ev in self.ready:
            ev.set()

    def produce(self):
        """The helper's part.  On an error it just stops: the task it failed on, like any
        other it has not done, is then run (and any error raised) by the recurrence."""
        try:
            n = len(self.bounds)
            for k in range(n):
                if self.stop:
                    return
                self.inputs.try_run(k)
            for k in range(n) if self.with_outputs else ():
                self.ready[k].wait()
                if self.stop:
                    return
                self.outputs.try_run(k)
        except Exception:
            return


class _LSTMDirection:
    """The recurrence of one LSTM direction in the transposed (features, batch) layout."""

    def __init__(self, xp, kernel, p, d, reverse, acts, fused, clip, coupled, cdt, product):
        self.xp, self.kernel, self.p, self.d, self.reverse = xp, kernel, p, d, reverse
        self.acts, self.fused, self.clip, self.coupled, self.cdt = acts, fused, clip, coupled, cdt
        self.product = product

    def _y(self, Y):
        """Y's (S, N, H) slots of this direction."""
        return Y[:, self.d] if self.p["layout"] == 0 else Y[:, :, self.d].transpose(1, 0, 2)

    def __call__(self, src, h, c, peep, Y):
        """Runs over the step inputs of src (see _FullProjection), from the initial states
        h and c (H, N) (not modified), with peepholes peep (3H,) or None; writes this
        direction into Y (when not None).  Returns the final (h, c) as (H, N)."""
        xp, p = self.xp, self.p
        S, N, H = p["S"], p["N"], p["H"]
        c = c.copy()
        tmp = xp.empty((H, N), dtype=self.cdt)
        if p["lens"] is not None:
            return self._masked(src.chunk(0), h, c, peep, Y, tmp)
        gates = self.product.out
        g4 = gates[:4 * H]
        cell = self._cell_fn(g4, c, peep, tmp)
        matmul, A, out_b = xp.matmul, self.product.A, self.product.out_b
        h = xp.ascontiguousarray(h)
        # h^T of every step, contiguous (a contiguous right operand keeps the product fast)
        hs = _scratch(xp, (S if Y is not None else 2, H, N), self.cdt)
        if Y is not None:
            yv = self._y(Y)
        for k, (t0, t1) in enumerate(src.bounds):
            arr = src.chunk(k)
            target = gates if arr.shape[1] == gates.shape[0] else g4
            for t in (range(t1 - 1, t0 - 1, -1) if self.reverse else range(t0, t1)):
                matmul(A, h, out=out_b)
                target += arr[t - t0]
                h = hs[t] if Y is not None else hs[t % 2]
                cell(h)
            if Y is not None:
                src.output(k, lambda t0=t0, t1=t1: yv[t0:t1].__setitem__(Ellipsis, hs[t0:t1].transpose(0, 2, 1)))
        src.finish()
        return h, c

    def _masked(self, xs, h, c, peep, Y, tmp):
        """The recurrence with sequence lengths over xs (S, 4H, N): past an entry's length
        its state is kept and its output is 0 (the reverse direction reads and writes step
        s at time lens - 1 - s)."""
        xp, p, kernel = self.xp, self.p, self.kernel
        S, N, H = p["S"], p["N"], p["H"]
        idx, valid = kernel._step_order(p, self.reverse)  # (S, N), (S, N, 1)
        valid = valid[..., 0]
        cols = xp.arange(N)
        if self.reverse:
            xs = xs[idx, :, cols[None, :]].transpose(0, 2, 1)  # (S, 4H, N) in step order
        g4 = self.product.out[:4 * H]
        hn = xp.empty((H, N), dtype=self.cdt)
        cn = xp.empty((H, N), dtype=self.cdt)
        cell = self._cell_fn(g4, cn, peep, tmp)
        yv = self._y(Y) if Y is not None else None
        h = h.copy()
        for s in range(S):
            self.product(h)
            g4 += xs[s]
            cn[...] = c
            cell(hn)
            v = valid[s]
            xp.copyto(c, cn, where=v)
            xp.copyto(h, hn, where=v)
            if Y is not None:
                yv[idx[s], cols] = xp.where(v, hn, 0).T  # (N, H)
        return h, c

    def _cell_fn(self, gates, c, peep, tmp):
        """A function out -> None doing one LSTM cell on the (4H, N) gate pre-activations in
        gates: updates c in place and writes the new h into out (both (H, N))."""
        xp = self.xp
        H = c.shape[0]
        f, g, hf = self.acts
        h_tanh = hf.name.lower() == "tanh"
        i, o, fg, cc = gates[:H], gates[H:2 * H], gates[2 * H:3 * H], gates[3 * H:]

        def h_out(out, o):
            if h_tanh:
                xp.tanh(c, out=tmp)
            else:
                tmp[...] = c
                hf.inplace(xp, tmp)
            xp.multiply(tmp, o, out=out)

        if self.fused:  # i, o, f rows are pre-halved: sigmoid(2y) = 0.5 * tanh(y) + 0.5
            ifo = gates[:3 * H]
            half = ifo.dtype.type(0.5)

            def cell(out):
                xp.tanh(gates, out=gates)
                xp.multiply(ifo, half, out=ifo)
                xp.add(ifo, half, out=ifo)
                xp.multiply(c, fg, out=c)
                xp.multiply(cc, i, out=cc)
                xp.add(c, cc, out=c)
                h_out(out, o)

            return cell

        clip, coupled, clipf = self.clip, self.coupled, _clip
        if peep is not None:
            pi, po, pf = (peep[k * H:(k + 1) * H].reshape(H, 1) for k in range(3))

        def cell(out):
            gi, go, gf, gc = i, o, fg, cc
            if peep is not None:
                gi += pi * c
                gf += pf * c
            ig = f.inplace(xp, clipf(xp, gi, clip))
            fgate = 1 - ig if coupled else f.inplace(xp, clipf(xp, gf, clip))
            cand = g.inplace(xp, clipf(xp, gc, clip))
            xp.multiply(c, fgate, out=c)
            cand *= ig
            xp.add(c, cand, out=c)
            if peep is not None:
                go += po * c
            h_out(out, f.inplace(xp, clipf(xp, go, clip)))

        return cell


# ---------------------------------------------------------------------- the layer


@specialize("LSTM.layer", device="cpu", ops=("LSTM",),
            agreement="rtol 1e-5 (float32): sigmoid as 0.5 * tanh(x / 2) + 0.5 on the default gates")
def lstm_host(kernel, p, acts, clip, coupled):
    """The whole LSTM layer on the host: Y (compute array in the output layout, None when
    not wanted) and the final h and c of each direction, (N, H) each."""
    xp = np
    c0_t, p_t = p["extras"]
    cdt = kernel.to_compute(p["x"]).dtype
    S, N, H, D = p["S"], p["N"], p["H"], p["D"]
    # per direction: one tanh over all gates on pre-halved i, o, f rows?
    fused = [p_t.is_absent and clip is None and not coupled and f.name.lower() == "sigmoid"
             and g.name.lower() == "tanh" for f, g, _ in acts]
    half = np.where(np.arange(4 * H) < 3 * H, 0.5, 1.0).astype(cdt)
    scale = [half if fu else None for fu in fused]
    w = _scaled(kernel.to_compute(p["w"], cdt), scale)  # (D, 4H, I)
    R_ = _scaled(kernel.to_compute(p["r"], cdt), scale)  # (D, 4H, H)
    bias = None
    if not p["b"].is_absent:
        b = kernel.to_compute(p["b"], cdt)
        bias = _scaled(b[:, :4 * H] + b[:, 4 * H:], scale)  # (D, 4H)
    peep = kernel.to_compute(p_t, cdt) if not p_t.is_absent else None
    h0 = kernel._state(p["h0"], p, cdt)
    c0 = kernel._state(c0_t, p, cdt)
    want_y = kernel.wants_output(0)
    y_shape = (S, D, N, H) if p["layout"] == 0 else (N, S, D, H)
    # every (time, direction) slot is written once (zeros past a sequence's length)
    Y = host_empty(y_shape, cdt, min_bytes=tuning.value("lstm.pooled_scratch_bytes")) if want_y else None
    xc = kernel.to_compute(p["x"], cdt)
    xsni = xc.transpose(1, 0, 2) if p["layout"] == 1 else xc  # X as (S, N, I)
    runs = [_LSTMDirection(xp, kernel, p, d, reverse, acts[d], fused[d], clip, coupled, cdt,
                           _StepProduct(xp, R_[d], N))
            for d, reverse in enumerate(p["dirs"])]
    bias_d = [None if bias is None else bias[d] for d in range(D)]
    chunked = p["lens"] is None and all(_ChunkedProjection.worth_it(r.product, p) for r in runs)
    if chunked and D == 1:
        finals = [_pipelined(runs[0], w[0], bias_d[0], xsni, h0, c0, peep, Y)]
    else:
        # chunked: each direction computes its projection itself, chunk by chunk, in
        # single-threaded products (no helper); else all at once before
        projT = None if chunked else _projection_t(w, bias, xsni, p)  # (D, 4H, S, N)
        finals = [None] * D

        def run_dir(d):
            r = runs[d]
            src = (_ChunkedProjection(w[d], bias_d[d], xsni, r.product, r.reverse, Y is not None)
                   if chunked else _FullProjection(projT[d]))
            try:
                finals[d] = r(src, h0[d].T, c0[d].T, None if peep is None else peep[d], Y)
            finally:
                if chunked:
                    src.release()

        if D == 2 and runs[0].product.blocks is not None:  # single-threaded products: two threads
            parallel_ranges(2, 1, lambda lo, hi: [run_dir(d) for d in range(lo, hi)])
        else:
            for d in range(D):
                run_dir(d)
    return Y, [f[0].T for f in finals], [f[1].T for f in finals]


def _pipelined(run, w, bias, xsni, h0, c0, peep, Y):
    """One direction whose input projection a helper thread computes alongside; the
    final (h, c)."""
    src = _ChunkedProjection(w, bias, xsni, run.product, run.reverse, Y is not None)
    fin = []

    def work(lo, hi):
        if lo == 0:  # the calling thread runs the recurrence (taking chunks not yet started)
            try:
                fin.append(run(src, h0[0].T, c0[0].T, None if peep is None else peep[0], Y))
            finally:
                src.abandon()
        if hi == 2:
            src.produce()

    try:
        parallel_ranges(2, 1, work)
    finally:
        src.release()
    return fin[0]


def _scaled(a, scale):
    """a (D, 4H, ...) with the rows of direction d multiplied by scale[d] (None: as is);
    a copy when any is scaled."""
    if all(s is None for s in scale):
        return a
    out = host_empty(a.shape, a.dtype, min_bytes=tuning.value("lstm.pooled_scratch_bytes"))
    for d, s in enumerate(scale):
        if s is None:
            out[d] = a[d]
        else:
            np.multiply(a[d], s.reshape((-1,) + (1,) * (a.ndim - 2)), out=out[d])
    return out


def _projection_t(w, bias, xsni, p):
    """W @ X^T (+ Wb + Rb) for every step and direction: (D, 4H, S, N) compute array."""
    S, N, I, D, GH = p["S"], p["N"], p["I"], p["D"], 4 * p["H"]
    projT = np.matmul(w.reshape(D * GH, I), xsni.reshape(S * N, I).T)  # (D*GH, S*N)
    if bias is not None:
        projT += bias.reshape(D * GH, 1)
    return projT.reshape(D, GH, S, N)
