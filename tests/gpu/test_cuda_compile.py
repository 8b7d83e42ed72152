"""Every CUDA kernel and every template instantiation the Python side can request compiles
for sm_80 and sm_90 without a GPU (NVRTC from the nvidia-cuda-nvrtc wheel), and hot
kernels do not spill registers to local memory."""

from __future__ import annotations

import pytest

from gpukernels.gpu import compile_check, launch

SOURCES = launch.all_sources()


def _nvrtc_or_skip():
    try:
        return compile_check.Nvrtc()
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_every_operator_source_is_declared():
    declared = {s.filename for s in SOURCES}
    assert "selftest.cu" in declared
    for src in SOURCES:
        assert (launch.source_dir() / src.filename).is_file(), src.filename
        exprs = src.expressions()
        assert exprs and len(exprs) == len(set(exprs)), src.filename


def test_tf32_variants_are_declared():
    """The TF32 tensor-core variants (float32 with allow_tf32) are instantiations of their
    sources' CudaSource, so test_compiles builds them for sm_80 and sm_90 and holds them to the
    no-spill rule of the hot kernels."""
    by_file = {s.filename: s for s in SOURCES}
    want = {"conv.cu": [f"gk_conv_tc<float, {bm}, {pw}>" for bm in (64, 128) for pw in ("false", "true")],
            "attention.cu": [f"gk_attn_tc<float, {d}, {nw}>" for d in (64, 128, 256) for nw in (4, 1)]}
    for filename, exprs in want.items():
        src = by_file[filename]
        declared = src.expressions()
        assert all(e in declared for e in exprs), (filename, [e for e in exprs if e not in declared])
        assert all(src.is_hot(e) for e in exprs)


@pytest.mark.parametrize("arch", compile_check.ARCHS)
@pytest.mark.parametrize("source", [s.filename for s in SOURCES])
def test_compiles(source, arch, record_property):
    _nvrtc_or_skip()
    src = next(s for s in SOURCES if s.filename == source)
    report = compile_check.check_source(src, arch, "nvrtc")
    table = compile_check.format_table([report])
    print(table)
    assert report.ok, f"{source} does not compile for {arch}:\n{report.log[-6000:]}"
    failed = [r for r in report.rows if r.failed]
    assert not failed, f"{source} for {arch}:\n{table}"
    for row in report.rows:
        record_property(f"{row.expr}@{arch}", f"regs={row.resources.registers} smem={row.resources.smem} "
                                              f"spills={row.resources.spill_stores}/{row.resources.spill_loads}")


def test_ptxas_report_parsing():
    log = """ptxas info    : Compiling entry function '_Z1kIfEvPT_x' for 'sm_90'
ptxas info    : Function properties for _Z1kIfEvPT_x
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]
"""
    r = compile_check.parse_ptxas(log)["_Z1kIfEvPT_x"]
    assert (r.registers, r.smem, r.stack, r.spill_stores, r.spill_loads, r.barriers) == (10, 1024, 8, 4, 12, 1)
    assert r.spills
