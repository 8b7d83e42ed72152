"""Host (NumPy) machinery of LSTM's fast path: blocked step products that stay in the
calling thread, and the input projection computed chunk by chunk by a helper thread
alongside the recurrence (see recurrent.LSTM)."""

from __future__ import annotations

import threading

import numpy as np


def _clip(xp, x, clip):
    """x bounded to [-clip, clip] (as is when clip is None)."""
    return x if clip is None else xp.clip(x, -clip, clip)

# OpenBLAS runs a product of at most about 2**19 multiply-adds in its calling thread (a
# small-matrix kernel) and hands larger ones to its thread pool.  For the many tiny
# products of a recurrence that hand-off costs more than it saves, it stalls for whole
# scheduler slices when the other core is busy, and the pool's workers then spin for
# ~0.1 s; so the host splits a step product into row blocks under that size, run by one
# batched matmul call in the calling thread.
_SMALL_PRODUCT = 1 << 19
_MIN_BLOCK_ROWS = 16
_PROJ_COLS = 128  # columns (steps x batch) of one chunk of the input projection


class _StepProduct:
    """out = A @ b for a fixed left operand A (M, K) and right operands b (K, N); out is
    an (Mp, N) buffer reused by every call whose first M rows hold the product (on the
    host A may be padded with zero rows to Mp = blocks * rows)."""

    @staticmethod
    def single_threaded(M, K, N) -> bool:
        """Whether the host runs an (M, K) @ (K, N) step product in the calling thread."""
        return M * K * N <= _SMALL_PRODUCT or _SMALL_PRODUCT // max(1, K * N) >= _MIN_BLOCK_ROWS

    def __init__(self, xp, A, N):
        self.xp = xp
        M, K = A.shape
        self.M = M
        self.blocks = None
        if xp is np and M * K * N > _SMALL_PRODUCT and self.single_threaded(M, K, N):
            rows = _SMALL_PRODUCT // max(1, K * N)
            nb = -(-M // rows)
            rows = -(-M // nb)
            self.blocks = (nb, rows)
        if self.blocks is None:
            self.A = xp.ascontiguousarray(A)
            self.out = xp.empty((M, N), dtype=A.dtype)
            self.out_b = self.out
        else:
            nb, rows = self.blocks
            Ab = np.zeros((nb * rows, K), dtype=A.dtype)
            Ab[:M] = A
            self.A = Ab.reshape(nb, rows, K)
            self.out = np.empty((nb * rows, N), dtype=A.dtype)
            self.out_b = self.out.reshape(nb, rows, N)

    def __call__(self, b):
        self.xp.matmul(self.A, b, out=self.out_b)
        return self.out


class _FullProjection:
    """Step inputs from the projection of every step computed at once: one chunk, the
    whole (4H, S, N) array, read as (S, 4H, N)."""

    def __init__(self, projT):
        self.T = max(1, projT.shape[1])
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
    the order the recurrence reads them, and the copies of finished chunks of h into Y.

    A chunk is one (4H, I) @ (I, T * N) product in single-threaded row blocks (about
    _PROJ_COLS columns: a more efficient shape than the N columns of a step).  A helper
    thread runs produce() alongside the recurrence: first ahead of it through the
    projections, then behind it through the copies.  The recurrence takes over any task
    the helper has not started, so nothing waits on a helper that does not get to run (and
    without a helper it computes every chunk as it needs it).  Host only."""

    @staticmethod
    def steps_per_chunk(N) -> int:
        return max(1, min(16, _PROJ_COLS // max(1, N)))

    @staticmethod
    def worth_it(product, p):
        return product.blocks is not None and p["S"] >= 2 * _ChunkedProjection.steps_per_chunk(p["N"])

    def __init__(self, w, bias, xsni, product, reverse, with_outputs):
        S, N, I = xsni.shape
        M = w.shape[0]
        self.T = T = self.steps_per_chunk(N)
        rows = max(_MIN_BLOCK_ROWS, _SMALL_PRODUCT // max(1, I * T * N))
        nb = -(-M // rows)
        rows = -(-M // nb)
        Wb = np.zeros((nb * rows, I), dtype=w.dtype)
        Wb[:M] = w
        self.Wb = Wb.reshape(nb, rows, I)
        self.bias = None if bias is None else bias.reshape(M, 1)
        self.xsni = xsni
        self.S, self.N, self.M = S, N, M
        n = -(-S // T)
        self.order = list(range(n))[::-1] if reverse else list(range(n))
        self.inputs = _SharedTasks(n, self._project)
        self.jobs = [None] * n
        self.ready = [threading.Event() for _ in range(n)]
        self.outputs = _SharedTasks(n, lambda k: self.jobs[k]())
        self.with_outputs = with_outputs
        self.stop = False

    def _project(self, k):
        """Chunk k as a (steps, 4H, N) view."""
        t0, t1 = k * self.T, min(self.S, (k + 1) * self.T)
        cols = (t1 - t0) * self.N
        xt = np.ascontiguousarray(self.xsni[t0:t1].reshape(cols, -1).T)  # (I, steps * N)
        nb, rows, _ = self.Wb.shape
        out = np.empty((nb * rows, cols), dtype=self.Wb.dtype)
        np.matmul(self.Wb, xt, out=out.reshape(nb, rows, cols))
        out = out[:self.M]
        if self.bias is not None:
            out += self.bias
        return out.reshape(self.M, t1 - t0, self.N).transpose(1, 0, 2)

    def chunk(self, k):
        return self.inputs.get(k)

    def output(self, k, job):
        """job (writing chunk k's outputs) may run now that chunk k's steps are done."""
        self.jobs[k] = job
        self.ready[k].set()

    def finish(self):
        for k in self.order:
            if self.jobs[k] is not None:
                self.outputs.get(k)

    def abandon(self):
        """Called by the recurrence when it ends (normally or not): the helper stops."""
        self.stop = True
        for ev in self.ready:
            ev.set()

    def produce(self):
        """The helper's part.  On an error it just stops: the task it failed on, like any
        other it has not done, is then run (and any error raised) by the recurrence."""
        try:
            for k in self.order:
                if self.stop:
                    return
                self.inputs.try_run(k)
            for k in self.order if self.with_outputs else ():
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
        hs = xp.empty((S if Y is not None else 2, H, N), dtype=self.cdt)
        if Y is not None:
            yv = self._y(Y)
        T = src.T
        n = -(-S // T)
        for k in (range(n - 1, -1, -1) if self.reverse else range(n)):
            arr = src.chunk(k)
            target = gates if arr.shape[1] == gates.shape[0] else g4
            t0, t1 = k * T, min(S, (k + 1) * T)
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
