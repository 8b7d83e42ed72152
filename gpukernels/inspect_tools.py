"""Inspection helpers: the observer behind ``gpukernels run --dump``.  (The ``parity``
and ``profile`` commands live in cli.py; their library code in parity.py and
profiling.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from .archive import write_npz


class IntermediateDumper:
    """An observer that keeps a host copy of every node output, then writes them to
    DIR/intermediates.npz with DIR/index.json (node, op, value, shape, dtype, key)."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.entries = []
        self.arrays = {}

    def __call__(self, node, inputs, outputs, seconds):
        from .tensor import to_host_value

        for name, v in zip(node.outputs, outputs):
            if not name:
                continue
            host = to_host_value(v)
            key = f"{len(self.arrays):05d}_" + re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
            entry = {"node": node.name, "op_type": node.op_type, "value": name, "key": key}
            if isinstance(host, np.ndarray):
                self.arrays[key] = host
                entry.update(shape=list(host.shape), dtype=str(host.dtype))
            elif isinstance(host, list):
                for i, item in enumerate(host):
                    self.arrays[f"{key}.{i}"] = np.asarray(item)
                entry.update(kind="sequence", length=len(host))
            else:
                entry.update(kind="optional-empty" if host is None else type(host).__name__)
            self.entries.append(entry)

    def finish(self, feeds: dict, output_names, values) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_npz(self.directory / "intermediates.npz", self.arrays)
        (self.directory / "index.json").write_text(json.dumps(
            {"inputs": {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)} for k, v in feeds.items()},
             "outputs": list(output_names), "values": self.entries}, indent=1))
