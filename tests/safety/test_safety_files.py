"""External data is read only from inside the model's folder, and never for a model
given as bytes or a ModelProto without a base_dir (issue 13.7)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gpukernels.errors import ModelError
from gpukernels.runtime import Session

W = np.arange(6, dtype=np.float32)


def _external_model(location: str, offset: int = 0, length: int | None = None) -> onnx.ModelProto:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[6])
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        w.external_data.add(key=k, value=v)
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "weights.bin").write_bytes(b"\x00" * 8 + W.tobytes())
    (tmp_path / "secret.bin").write_bytes(W.tobytes())
    return d


def test_external_data_from_the_model_folder(folder):
    path = folder / "m.onnx"
    path.write_bytes(_external_model("weights.bin", offset=8, length=24).SerializeToString())
    np.testing.assert_array_equal(Session(str(path)).run(None, {})[0], W)


def test_bytes_and_protos_read_no_files_without_base_dir(folder, monkeypatch):
    monkeypatch.chdir(folder)  # the file would be found relative to the current directory
    model = _external_model("weights.bin", offset=8)
    for given in (model, model.SerializeToString()):
        with pytest.raises(ModelError, match="base_dir"):
            Session(given)
    np.testing.assert_array_equal(Session(model, base_dir=str(folder)).run(None, {})[0], W)


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin", "/etc/passwd", "link.bin"])
def test_locations_outside_the_folder_are_refused(folder, location):
    os.symlink(folder.parent / "secret.bin", folder / "link.bin")
    path = folder / "m.onnx"
    path.write_bytes(_external_model(location).SerializeToString())
    with pytest.raises(ModelError, match="outside the model's folder|relative to the model's folder"):
        Session(str(path))


@pytest.mark.parametrize("offset, length, words", [
    (0, 4 << 40, "does not match its dims"),
    (1 << 40, None, "outside"),
    (16, 24, "asks for bytes"),
    (-8, None, "outside"),
])
def test_byte_ranges_are_checked_before_reading(folder, offset, length, words):
    path = folder / "m.onnx"
    path.write_bytes(_external_model("weights.bin", offset, length).SerializeToString())
    with pytest.raises(ModelError, match=words):
        Session(str(path))


def test_missing_external_file(folder):
    path = folder / "m.onnx"
    path.write_bytes(_external_model("nothing.bin").SerializeToString())
    with pytest.raises(ModelError, match="does not exist"):
        Session(str(path))
