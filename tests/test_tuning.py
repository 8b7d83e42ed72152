"""The tuning table (gpukernels/host/tuning.py): every entry documented and read by the
code, overrides checked and undone."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpukernels.errors import OptionError
from gpukernels.host import tuning

PACKAGE = Path(__file__).resolve().parent.parent / "gpukernels"


def test_every_entry_is_documented_and_read_somewhere():
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "tuning.py")
    entries = tuning.table()
    assert len({e.name for e in entries}) == len(entries)
    for e in entries:
        assert e.unit and len(e.trade) > 20 and e.measured, e.name
        # read by name, or by a name built from a device kind ("tree.chunk_pairs_{...}")
        stem = e.name.rsplit("_", 1)[0] if e.name.endswith(("_cpu", "_cuda")) else e.name
        assert f'"{e.name}"' in source or f'"{stem}_' in source, f"{e.name} is never read"


def test_override_checks_names_and_kinds_and_restores():
    name = "elementwise.block_elems"
    before = tuning.value(name)
    with tuning.override(**{name: 64}):
        assert tuning.value(name) == 64
    assert tuning.value(name) == before
    with pytest.raises(OptionError, match="elementwise.block_elems"):
        with tuning.override(**{"elementwise.block_elem": 1}):
            pass
    with pytest.raises(OptionError, match="an int"):
        with tuning.override(**{name: 1.5}):
            pass
    with pytest.raises(OptionError):
        tuning.value("no.such_entry")
