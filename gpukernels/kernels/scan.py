"""Scan (opset 8 with batch axis and sequence_lens; opset 9+ with axes and directions).
Shares its body runner and scan-output columns with Loop (see controlflow.py)."""

from __future__ import annotations

import numpy as np

from ..dtypes import DataType
from ..tensor import Tensor
from .base import describe, register
from ..limits import check_allocation
from ._controlflow_common import _Body, _Column, _ControlFlowBase, _Held, _pack


@register()
class Scan(_ControlFlowBase):
    """Iterate body over slices of the scan inputs, carrying state.

    Opset 9+: inputs are N initial states then M = num_scan_inputs scan inputs, each
    scanned along scan_input_axes[i] (default 0; negative axes count from the back) in
    scan_input_directions[i] (0 forward, 1 reverse).  The body takes (*state,
    *scan_elements) and returns (*state, *scan_output_elements); each scan output is
    stacked along scan_output_axes[j] (default 0), appended (0) or prepended (1) per
    scan_output_directions[j].  All scan inputs must have the same length along their
    axis.  With length 0 the final states are the initial ones and the scan outputs are
    empty, typed from the body's declared outputs (unknown dimensions 0).

    Opset 8: the first input is sequence_lens (optional, INT64 [batch]); states and scan
    inputs carry a leading batch axis, scan inputs a sequence axis 1; ``directions``
    gives the scan direction per scan input.  Each batch entry runs its own loop of
    sequence_lens[b] steps (a reverse scan starts at its last valid step); scan output
    positions past sequence_lens[b] are left 0 (the spec leaves them undefined).

    ``assemble(final_states, per_iteration_scan_values, ...)`` stacks scan outputs
    evaluated elsewhere."""

    def __call__(self, *inputs, body=None, num_scan_inputs=None, scan_input_axes=None,
                 scan_input_directions=None, scan_output_axes=None, scan_output_directions=None,
                 directions=None):
        body = self.graph_attr(body, "body")
        if num_scan_inputs is None:
            raise self.error("required attribute 'num_scan_inputs' is missing")
        m = int(num_scan_inputs)
        if self.since_version < 9:
            if scan_input_axes is not None or scan_input_directions is not None or \
                    scan_output_axes is not None or scan_output_directions is not None:
                raise self.error("opset-8 Scan has no scan_input/output axes or directions attributes; "
                                 "use 'directions'")
            if not inputs:
                raise self.error("opset-8 Scan needs sequence_lens (possibly omitted) then its inputs")
            return self._scan8(inputs[0], list(inputs[1:]), body, m, directions)
        if directions is not None:
            raise self.error("'directions' is the opset-8 attribute; use scan_input_directions")
        n, k = self._counts(inputs, body, m)
        in_axes = self._int_list(scan_input_axes, m, "scan_input_axes", 0)
        in_dirs = self._int_list(scan_input_directions, m, "scan_input_directions", 0, flags=True)
        out_axes = self._int_list(scan_output_axes, k, "scan_output_axes", 0)
        out_dirs = self._int_list(scan_output_directions, k, "scan_output_directions", 0, flags=True)
        states = [self._state(v, f"initial state {i}") for i, v in enumerate(inputs[:n])]
        scan_in = [self._state(v, f"scan input {i}") for i, v in enumerate(inputs[n:])]
        length = None
        sliced = []
        for i, (x, axis, rev) in enumerate(zip(scan_in, in_axes, in_dirs)):
            r = x.ndim
            if r == 0:
                raise self.error(f"scan input {i} is a scalar; it needs an axis to scan", **{f"scan_input_{i}": x})
            if not -r <= axis < r:
                raise self.error(f"scan_input_axes[{i}] = {axis} is out of range for rank {r}",
                                 **{f"scan_input_{i}": x})
            a = axis % r
            if length is None:
                length = x.shape[a]
            elif x.shape[a] != length:
                raise self.error(f"scan input {i} has length {x.shape[a]} along axis {axis}, scan input 0 "
                                 f"has {length}; scan inputs must agree",
                                 **{f"scan_input_0": scan_in[0], f"scan_input_{i}": x})
            sliced.append(self._steps(x, a, rev))
        runner = _Body(self, body, ("V", 0))
        final, columns = self._loop(runner, states, sliced, length, n, k)
        return self._finish(final, columns, out_axes, out_dirs, runner.declared[n:])

    # ------------------------------------------------------------ helpers
    def _int_list(self, values, count, name, default, flags=False):
        if values is None:
            return [default] * count
        values = [int(v) for v in values]
        if len(values) != count:
            raise self.error(f"{name} has {len(values)} entries, expected {count}")
        if flags and any(v not in (0, 1) for v in values):
            raise self.error(f"{name} entries must be 0 (forward) or 1 (reverse), got {values}")
        return values

    def _state(self, value, where):
        v = self.value_here(value, where)
        if not isinstance(v, Tensor):
            raise self.type_error(f"{where} must be a tensor, got {describe(v)}")
        self.check_value_type(v, where)
        return v

    def _steps(self, x: Tensor, axis: int, reverse: bool):
        """(array with the scan axis first, contiguous, in scan order; element type)."""
        xp = self.xp_for(x.data_type)
        arr = xp.moveaxis(x.array, axis, 0) if axis else x.array
        if reverse:
            arr = arr[::-1]
        if not arr.flags.c_contiguous:
            arr = xp.ascontiguousarray(arr)
        return arr, x.data_type

    def _loop(self, body, states, sliced, length, n, k, held=None, later=0):
        """Run the body over steps 0..length-1: (final states, k _Columns).

        The scan values held count against max_tensor_bytes (held, a _Held shared by
        the batch entries of an opset-8 Scan): after the first step, that step's bytes
        times the steps still to come (this loop's and the `later` ones) are checked at
        once, then the running total as steps accumulate."""
        columns = [_Column() for _ in range(k)]
        held = _Held(self) if held is None else held
        wrap = Tensor.wrap
        t = 0
        length = length or 0
        while t < length:
            args = states + [wrap(arr[t, ...], dt) for arr, dt in sliced]
            prog = body.program_for(args)
            if prog is not None:
                t, states, outs = self._fast(prog, t, length, states, [arr for arr, _ in sliced],
                                             columns, n, held)
                if outs is None:
                    continue
                body.left(prog, outs)  # step t left the compiled path
            else:
                outs = body.run(args, record=length - t >= 2)
            states = outs[:n]
            scan_values = outs[n:]
            for col, v in zip(columns, scan_values):
                col.add(v)
            if scan_values:
                before = held.bytes
                held.add(scan_values)
                if t == 0:
                    held.expect(held.bytes - before, length - 1 + later, " (the scan length)")
            t += 1
        return states, columns

    def _fast(self, prog, t, length, states, arrays, columns, n, held):
        """Steps t, t+1, ... on arrays through the compiled body while the states keep
        their signature.  Returns (t, states, outs): outs are the unchecked outputs of
        step t when it left the compiled path, else None.  The scan bytes held (held, a
        _Held) grow by the same step each iteration: one add and a compare."""
        out_sig = prog.out_sig
        stable = prog.in_sig[:n] == out_sig[:n]
        appends = [col.fast(sig[0]) for col, sig in zip(columns, out_sig[n:])]
        one = appends[0] if len(appends) == 1 else None
        st = [s.array for s in states]
        run = prog.run
        # the steps' slices (iterating a rank >= 2 array gives the same views as a[t, ...])
        steps = zip(*[iter(a[t:length]) if a.ndim > 1 else (a[i, ...] for i in range(t, length))
                      for a in arrays])
        first, total, cap = t, held.bytes, held.cap
        step = held.step_bytes(()) if not appends else None
        token = prog.guard.enter_strict()
        try:
            for xs in steps:
                ok, outs = run([*st, *xs])
                if not ok:
                    return t, states, outs
                t += 1
                st = outs[:n]
                if one is not None:
                    one(outs[n])
                else:
                    for append, a in zip(appends, outs[n:]):
                        append(a)
                if step is None:
                    step = held.step_bytes(outs[n:])
                total += step
                if total > cap:
                    raise held.over(total, held.iterations + t - first)
                if not stable:
                    break
        finally:
            prog.guard.leave(token)
            if appends:
                held.bytes = total
                held.iterations += t - first
        return t, [Tensor.wrap(a, sig[0]) for a, sig in zip(st, out_sig[:n])], None

    def _finish(self, final, columns, out_axes, out_dirs, declared):
        results = list(final)
        for j, col in enumerate(columns):
            if col:
                results.append(col.stack(self, out_axes[j], f"scan output {j}", reverse=bool(out_dirs[j])))
            else:
                results.append(self.empty_scan_output(declared[j] if declared else ("", 0, None),
                                                      out_axes[j], f"scan output {j}"))
        return _pack(results)

    def assemble(self, final_states, per_iteration_scan_values, scan_output_axes=None,
                 scan_output_directions=None, scan_output_types=None):
        """The Scan outputs from values evaluated elsewhere: final_states followed by the
        scan outputs stacked from per_iteration_scan_values (one list per iteration, in
        iteration order) along scan_output_axes, reversed where scan_output_directions
        is 1.  scan_output_types types the outputs of a zero-length scan."""
        rows, types, k = self.scan_rows(per_iteration_scan_values, scan_output_types)
        out_axes = self._int_list(scan_output_axes, k, "scan_output_axes", 0)
        out_dirs = self._int_list(scan_output_directions, k, "scan_output_directions", 0, flags=True)
        final = [self._state(v, f"final state {i}") for i, v in enumerate(final_states)]
        columns = [_Column([self.value_here(r[j], f"scan value {j}") for r in rows]) for j in range(k)]
        return self._finish(final, columns, out_axes, out_dirs, types)

    def _counts(self, inputs, body, m):
        """(states, scan outputs) for num_scan_inputs m, checked against the body."""
        if m < 1:
            raise self.error(f"num_scan_inputs must be at least 1, got {m}")
        if m > len(inputs):
            raise self.error(f"num_scan_inputs is {m} but only {len(inputs)} states and scan inputs are given")
        n = len(inputs) - m
        n_in, n_out = len(body.input), len(body.output)
        if n_in != n + m:
            raise self.error(f"body declares {n_in} inputs; with {n} states and {m} scan inputs it "
                             f"must declare {n + m}")
        if n_out < n:
            raise self.error(f"body declares {n_out} outputs; it must return at least the {n} states")
        return n, n_out - n

    # ------------------------------------------------------------ opset 8
    def _scan8(self, sequence_lens, inputs, body, m, directions):
        n, k = self._counts(inputs, body, m)
        dirs = self._int_list(directions, m, "directions", 0, flags=True)
        states = [self._state(v, f"initial state {i}") for i, v in enumerate(inputs[:n])]
        scan_in = [self._state(v, f"scan input {i}") for i, v in enumerate(inputs[n:])]
        batch = length = None
        for i, x in enumerate(scan_in):
            if x.ndim < 2:
                raise self.error(f"scan input {i} needs a batch axis and a sequence axis",
                                 **{f"scan_input_{i}": x})
            if batch is None:
                batch, length = x.shape[0], x.shape[1]
            elif x.shape[0] != batch or x.shape[1] != length:
                raise self.error(f"scan input {i} has batch/sequence sizes {list(x.shape[:2])}, scan input 0 "
                                 f"has {[batch, length]}; scan inputs must agree",
                                 **{f"scan_input_0": scan_in[0], f"scan_input_{i}": x})
        for i, s in enumerate(states):
            if s.ndim < 1 or s.shape[0] != batch:
                raise self.error(f"initial state {i} must have the batch size {batch} as its first dimension",
                                 **{f"state_{i}": s})
        if sequence_lens is None or (isinstance(sequence_lens, Tensor) and sequence_lens.is_absent):
            lens = [length] * batch
        else:
            sl = self.tensor(sequence_lens, "sequence_lens")
            if sl.data_type != DataType.INT64:
                raise self.type_error(f"sequence_lens must be int64, got {describe(sl)}", sequence_lens=sl)
            if sl.shape != (batch,):
                raise self.error(f"sequence_lens must have shape [{batch}]", sequence_lens=sl)
            lens = [int(v) for v in np.asarray(sl.numpy())]
            if any(v < 0 or v > length for v in lens):
                raise self.error(f"sequence_lens values {lens} must lie in [0, {length}]", sequence_lens=sl)
        runner = _Body(self, body, ("V", 0))
        declared = runner.declared

        finals = [[] for _ in range(n)]
        per_batch = []  # per batch: list of k columns
        held = _Held(self)
        later = sum(lens)
        for b in range(batch):
            later -= lens[b]
            st = [self.result(s.array[b, ...], s.data_type) for s in states]
            steps = []
            for x, rev in zip(scan_in, dirs):
                arr = x.array[b, :lens[b]]
                if rev:
                    arr = arr[::-1]
                steps.append((arr, x.data_type))
            final, columns = self._loop(runner, st, steps, lens[b], n, k, held, later)
            for j, v in enumerate(final):
                finals[j].append(v)
            per_batch.append([col.values() for col in columns])
        results = []
        for j in range(n):
            if batch:
                results.append(self.stack(finals[j], 0, f"final state {j}"))
            else:
                results.append(states[j])
        for j in range(k):
            results.append(self._batched_output(per_batch, j, batch, length, declared[n + j]))
        return _pack(results)

    def _batched_output(self, per_batch, j, batch, length, declared):
        """[batch, length, ...] from each batch entry's scan values, zero-padded."""
        sample = next((cols[j][0] for cols in per_batch if cols[j]), None)
        if sample is None:
            empty = self.empty_scan_output(declared, 0, f"scan output {j}")  # [0, *elem]
            elem = empty.shape[1:]
            dt = empty.data_type
            check_allocation(self, (batch, length) + tuple(elem), empty.array.dtype, f"scan output {j}")
            xp = self.xp_for(dt)
            return self.result(xp.zeros((batch, length) + tuple(elem), dtype=empty.array.dtype), dt)
        check_allocation(self, (batch, length) + tuple(sample.shape), sample.array.dtype, f"scan output {j}")
        rows = []
        for b, cols in enumerate(per_batch):
            col = cols[j]
            if col:
                stacked = self.stack(col, 0, f"scan output {j} (batch {b})")
                if stacked.shape[1:] != sample.shape or stacked.data_type != sample.data_type:
                    raise self.error(f"scan output {j}: batch {b} produced {describe(col[0])}, another batch "
                                     f"{describe(sample)}")
                arr = stacked.array
            else:
                arr = None
            rows.append(arr)
        xp = self.xp_for(sample.data_type)
        out = xp.zeros((batch, length) + tuple(sample.shape), dtype=sample.array.dtype)
        for b, arr in enumerate(rows):
            if arr is not None:
                out[b, :arr.shape[0]] = arr
        return self.result(out, sample.data_type)


# ------------------------------------------------------------ module helpers
