"""The official ONNX backend cases through gpukernels.backend (see gpukernels.conformance).

Every case runs on cpu (and cuda when usable).  A case whose model uses an operator with
no kernel yet is skipped with the operator named (the conformance command counts these
separately); every other case must pass, except those in known_failures.txt, which are
strict xfails (a listed case that passes fails the run)."""

from __future__ import annotations

import pytest

from gpukernels.conformance import collect, known_failures, run_case
from gpukernels.xp import cuda_status

_KNOWN = known_failures()
_CASES = collect()


def _params():
    for case in _CASES:
        marks = [pytest.mark.conformance]
        if case.id in _KNOWN:
            marks.append(pytest.mark.xfail(strict=True, reason=_KNOWN[case.id]))
        yield pytest.param(case, id=case.id, marks=marks)


def test_known_failures_name_real_cases():
    ids = {c.id for c in _CASES}
    stale = sorted(set(_KNOWN) - ids)
    assert not stale, f"known_failures.txt lists cases that do not exist: {stale}"


@pytest.mark.parametrize("case", list(_params()))
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_official_case(case, device):
    if device == "cuda" and not cuda_status().available:
        pytest.skip(f"no usable GPU: {cuda_status().reason}")
    outcome = run_case(case, device)
    if outcome.status == "missing-kernel":
        pytest.skip(outcome.message)
    assert outcome.status == "passed", outcome.message
