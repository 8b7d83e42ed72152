"""The import graph of gpukernels/ has no cycle, kernels/ never imports runtime/, host/
imports neither, and nothing imports the CLI.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
statement counts, at module level and inside functions alike (an import inside a
function is how a cycle hides), relative imports resolved.  No module reaches into
another package's private modules or names (``numpy._core...``): they change without
notice.  ``from pkg import name``
is an edge to the module ``pkg.name`` when that is a module, else to ``pkg``.  Only
explicit imports make edges: that importing ``a.b.c`` first runs the package
``a/__init__`` is Python's mechanics, not a dependency of the importing module.  Plugin
discovery by name (``kernels.load_all`` importing every kernel module,
``gpu.accelerated`` importing a CUDA launcher on first use) is not an import statement
and not an edge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpukernels"


def _modules() -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (file, is a package __init__)} of every module in gpukernels/."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        out[".".join(parts)] = (path, is_pkg)
    return out


def _imports(tree: ast.Module, module: str, is_pkg: bool):
    """(dotted name imported, line) for every import statement anywhere in tree."""
    package = module if is_pkg else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 > len(parts) - 1:
                    raise AssertionError(f"{module}:{node.lineno}: relative import beyond the package")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                yield (base, f"{base}.{alias.name}"), node.lineno


def import_graph() -> dict[str, dict[str, list[int]]]:
    """{module: {gpukernels module it imports: [lines]}}."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, list[int]]] = {}
    for module, (path, is_pkg) in modules.items():
        edges = graph.setdefault(module, {})
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, line in _imports(tree, module, is_pkg):
            if isinstance(name, tuple):  # from base import attr: the submodule when it is one
                base, sub = name
                name = sub if sub in modules else base
            if name != "gpukernels" and not name.startswith("gpukernels."):
                continue
            target = resolve(name)
            if target is not None and target != module:
                edges.setdefault(target, []).append(line)
    return graph


def cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def _describe(graph, component) -> str:
    members = set(component)
    lines = [f"cycle among {', '.join(component)}:"]
    for a in component:
        for b, at in sorted(graph[a].items()):
            if b in members:
                lines.append(f"  {a} -> {b} (line {', '.join(map(str, sorted(set(at))))})")
    return "\n".join(lines)


def test_the_graph_is_read(graph):
    """The reader sees module-level, function-level and relative imports (so that the
    tests below cannot pass on an empty graph)."""
    assert len(graph) > 50
    assert "gpukernels.kernels.base" in graph["gpukernels.runtime.graph"]
    assert "gpukernels.dtypes" in graph["gpukernels.kernels.base"]  # from .. import dtypes
    assert "gpukernels.runtime" in graph["gpukernels.cli"]  # imported inside a function


def test_cycle_finder():
    assert cycles({"a": {"b": [1]}, "b": {"c": [1]}, "c": {"a": [1]}, "d": {"a": [1]}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": [1]}, "b": {}, "c": {"b": [1]}}) == []


def test_no_import_cycles(graph):
    found = cycles(graph)
    assert not found, "\n".join(_describe(graph, c) for c in found)


def test_kernels_never_import_the_runtime(graph):
    bad = [f"{a} -> {b} (line {lines[0]})" for a, edges in graph.items()
           if a == "gpukernels.kernels" or a.startswith("gpukernels.kernels.")
           for b, lines in edges.items() if b == "gpukernels.runtime" or b.startswith("gpukernels.runtime.")]
    assert not bad, "kernels/ reaches runtime/ through the SubgraphRunner it is given, never by import:\n" + \
        "\n".join(bad)


def test_host_never_imports_kernels_or_the_runtime(graph):
    """host/ (threads, the buffer arena, tuning) sits below the kernels and the runtime:
    kernels call it, the runtime makes a Session's arena current for a run."""
    above = ("gpukernels.kernels", "gpukernels.runtime")
    bad = [f"{a} -> {b} (line {lines[0]})" for a, edges in graph.items()
           if a == "gpukernels.host" or a.startswith("gpukernels.host.")
           for b, lines in edges.items() if any(b == p or b.startswith(p + ".") for p in above)]
    assert "gpukernels.host.arena" in graph and not bad, "\n".join(bad)


def test_nothing_imports_the_cli(graph):
    bad = [f"{a} (line {edges['gpukernels.cli'][0]})" for a, edges in graph.items() if "gpukernels.cli" in edges]
    assert not bad, "gpukernels.cli is a leaf; imported by: " + ", ".join(bad)


def test_no_private_imports_from_other_packages():
    bad = []
    for module, (path, _) in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module != "__future__":
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            bad += [f"{module}:{node.lineno}: {name}" for name in names
                    if not name.startswith("gpukernels") and any(part.startswith("_") for part in name.split("."))]
    assert not bad, "private imports from other packages:\n" + "\n".join(bad)


def test_kernel_loading_from_many_threads_at_once():
    """load_all from 8 threads of a fresh process: every thread sees the whole registry
    (none returns early while another thread is still importing)."""
    import subprocess
    import sys

    code = """if True:
        import threading
        from gpukernels.kernels import base
        counts, barrier = [], threading.Barrier(8)
        def worker():
            barrier.wait()
            base.lookup("Conv")
            counts.append(len(base.registered()))
        threads = [threading.Thread(target=worker) for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(sorted(set(counts)), len(counts))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr
    counts, n = out.stdout.strip().rsplit(" ", 1)
    full = subprocess.run([sys.executable, "-c", "from gpukernels.kernels import base, load_all; load_all(); "
                           "print(len(base.registered()))"], capture_output=True, text=True, timeout=300,
                          cwd=PACKAGE.parent)
    assert counts == f"[{full.stdout.strip()}]" and n == "8", (out.stdout, full.stdout)
