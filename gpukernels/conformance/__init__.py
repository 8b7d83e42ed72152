"""The official ONNX backend test cases, run through ``gpukernels.backend``.

Node cases are generated in memory by the installed onnx package
(``onnx.backend.test.case.node.collect_testcases``); model cases come from the onnx
wheel's ``backend/test/data`` folders (simple, pytorch-converted, pytorch-operator, and
the ``real`` cases that point at the bundled ``light`` models).  Outputs are compared
with the official rule (``Runner.assert_similar_outputs``) and the case's tolerances.

Elements whose expected value the spec leaves undefined (out-of-range float to integer
casts) are not compared: see ``undefined.py``.  Known failures live in ``known_failures.txt`` beside this file, one per line with the
reason; the list is strict (a listed case that passes is reported as an error).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")
KNOWN_FAILURES_FILE = Path(__file__).with_name("known_failures.txt")


@dataclass
class Case:
    name: str
    kind: str
    testcase: object  # onnx TestCase
    operator: str = ""

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass
class Outcome:
    case: Case
    status: str  # passed | failed | missing-kernel
    message: str = ""
    seconds: float = 0.0
    missing_ops: list = field(default_factory=list)


@functools.lru_cache(maxsize=1)
def _node_testcases():
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


@functools.lru_cache(maxsize=1)
def _snake_ops() -> list:
    names = {s.name for s in onnx.defs.get_all_schemas_with_history()}
    pairs = [(re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", n).lower(), n) for n in names]
    return sorted(pairs, key=lambda p: -len(p[0]))


def _operator_of(name: str, model: onnx.ModelProto | None) -> str:
    stem = name[5:] if name.startswith("test_") else name
    for snake, op in _snake_ops():
        if stem == snake or stem.startswith(snake + "_"):
            return op
    if model is not None and model.graph.node:
        return model.graph.node[0].op_type
    return stem


def collect(kinds=KINDS, pattern: str | None = None) -> list[Case]:
    """Every official case of the given kinds whose id matches the regex pattern."""
    from onnx.backend.test.loader import load_model_tests

    cases = []
    for kind in kinds:
        if kind == "node":
            for tc in _node_testcases():
                cases.append(Case(tc.name, "node", tc, _operator_of(tc.name, tc.model)))
        else:
            for tc in sorted(load_model_tests(kind=kind), key=lambda t: t.name):
                cases.append(Case(tc.name, kind, tc, kind))
    if pattern:
        rx = re.compile(pattern)
        cases = [c for c in cases if rx.search(c.id)]
    return cases


def known_failures(path: Path = KNOWN_FAILURES_FILE) -> dict[str, str]:
    """{case id: reason}.  Lines: '<kind>/<name>  # <reason>'; a reason is required."""
    out = {}
    if not path.exists():
        return out
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        case_id, sep, reason = line.partition("#")
        if not sep or not reason.strip():
            raise ValueError(f"{path}:{lineno}: a known failure needs a reason after '#'")
        out[case_id.strip()] = reason.strip()
    return out


def _official_data_root() -> str:
    import onnx.backend.test

    return os.path.join(os.path.dirname(onnx.backend.test.__file__), "data")


def _load_model_case(case: Case):
    """(model, [(inputs, expected_outputs)]) for a model case."""
    from onnx.backend.test.runner import Runner

    tc = case.testcase
    if tc.url is not None and tc.url.startswith("onnx/backend/test/data/light/"):
        path = os.path.join(_official_data_root(), "light", os.path.basename(tc.url))
        model = onnx.load(path)
        inits = {i.name for i in model.graph.initializer}
        inputs = [Runner.generate_dummy_data(x, seed=0, name=tc.model_name, random=False)
                  for x in model.graph.input if x.name not in inits]
        prefix = os.path.splitext(path)[0]
        expected = []
        for i in range(len(model.graph.output)):
            t = onnx.TensorProto()
            with open(f"{prefix}_output_{i}.pb", "rb") as f:
                t.ParseFromString(f.read())
            expected.append(onnx.numpy_helper.to_array(t))
        return model, [(inputs, expected)]
    model = onnx.load(os.path.join(tc.model_dir, "model.onnx"))
    data = []
    for ds in sorted(glob.glob(os.path.join(tc.model_dir, "test_data_set*"))):
        inputs, outputs = [], []
        n_in = len(glob.glob(os.path.join(ds, "input_*.pb")))
        for i in range(n_in):
            Runner._load_proto(None, os.path.join(ds, f"input_{i}.pb"), inputs, model.graph.input[i].type)
        n_out = len(glob.glob(os.path.join(ds, "output_*.pb")))
        for i in range(n_out):
            Runner._load_proto(None, os.path.join(ds, f"output_{i}.pb"), outputs, model.graph.output[i].type)
        data.append((inputs, outputs))
    return model, data


def _normalize(item):
    if isinstance(item, onnx.TensorProto):
        return onnx.numpy_helper.to_array(item)
    return item


def missing_operators(model: onnx.ModelProto) -> list[str]:
    """Operators of the model (and its subgraphs) with neither a kernel, a model-local
    function, nor a schema function body."""
    from ..kernels import load_all
    from ..kernels.base import has_kernel

    load_all()
    local = {(f.domain, f.name) for f in model.functions}
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    missing = set()

    def visit(nodes):
        for n in nodes:
            dom = "" if n.domain == "ai.onnx" else n.domain
            if not has_kernel(n.op_type, dom) and (dom, n.op_type) not in local:
                try:
                    s = onnx.defs.get_schema(n.op_type, opsets.get(dom, 1000), dom)
                    if not (s.has_function or s.has_context_dependent_function):
                        missing.add(f"{dom + '::' if dom else ''}{n.op_type}")
                except onnx.defs.SchemaError:
                    missing.add(f"{dom + '::' if dom else ''}{n.op_type}")
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g.node)
                for g in a.graphs:
                    visit(g.node)

    visit(model.graph.node)
    for f in model.functions:
        visit(f.node)
    return sorted(missing)


def run_case(case: Case, device: str = "cpu", paths: str | None = None) -> Outcome:
    """Run one official case through gpukernels.backend and compare; paths: the option
    'paths' ('auto' or 'reference'; None: GPUKERNELS_PATHS or 'auto')."""
    from onnx.backend.test.runner import Runner

    from .. import backend
    from .undefined import defined_elements, mask_undefined

    t0 = time.perf_counter()
    try:
        if case.kind == "node":
            model = case.testcase.model
            data = [([_normalize(i) for i in ins], [_normalize(o) for o in outs])
                    for ins, outs in case.testcase.data_sets]
        else:
            model, data = _load_model_case(case)
        missing = missing_operators(model)
        if missing:
            return Outcome(case, "missing-kernel", "no kernel for " + ", ".join(missing),
                           time.perf_counter() - t0, missing)
        rep = backend.prepare(model, "CUDA" if device.startswith("cuda") else "CPU",
                              options={"paths": paths} if paths else None)
        for inputs, expected in data:
            # twice: the second run of the same input signature goes through the
            # compiled plan (runtime.body.CompiledGraph), which must agree
            for _ in range(2):
                with np.errstate(all="ignore"):
                    outputs = list(rep.run(inputs))
                # elements whose value the spec leaves undefined are not compared
                expected, outputs = mask_undefined(
                    expected, outputs, defined_elements(model, inputs, expected))
                Runner.assert_similar_outputs(expected, outputs, rtol=case.testcase.rtol,
                                              atol=case.testcase.atol, model_dir=case.id)
    except Exception as exc:  # a failing case is data here, not a crash
        first = str(exc).strip().splitlines()
        return Outcome(case, "failed", f"{type(exc).__name__}: {' | '.join(first[:6])[:600]}",
                       time.perf_counter() - t0)
    return Outcome(case, "passed", "", time.perf_counter() - t0)
