"""CastMap, CategoryMapper, DictVectorizer, LabelEncoder, OneHotEncoder, ZipMap."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.ml.encoders import (CastMap, CategoryMapper, DictVectorizer, LabelEncoder, OneHotEncoder,
                                            ZipMap)
from gpukernels.tensor import Tensor

from tests.ort_reference import run_ml_node, run_ml_node_if_implemented


def K(cls, device, version=None):
    return cls(KernelContext(device), version=version)


def test_cast_map(device):
    m = {3: 1.25, 1: -2.5, 4: 7.0}
    y = K(CastMap, device)(m).numpy()
    np.testing.assert_array_equal(y, np.array([[-2.5, 1.25, 7.0]], np.float32))
    y = K(CastMap, device)(m, cast_to="TO_INT64", map_form="SPARSE", max_map=6).numpy()
    np.testing.assert_array_equal(y, [[0, -2, 0, 1, 7, 0]])
    np.testing.assert_array_equal(
        y, run_ml_node("CastMap", [m], dict(cast_to="TO_INT64", map_form="SPARSE", max_map=6))[0])
    s = K(CastMap, device)(m, cast_to="TO_STRING").numpy()
    assert s.tolist() == [["-2.500000", "1.250000", "7.000000"]]
    np.testing.assert_array_equal(s, run_ml_node("CastMap", [m], dict(cast_to="TO_STRING"))[0])
    # string values, sequences of maps
    y = K(CastMap, device)([{0: "1.5", 2: "3"}, {0: "2", 2: "-1"}], map_form="SPARSE", max_map=3).numpy()
    np.testing.assert_array_equal(y, np.array([[1.5, 0, 3], [2, 0, -1]], np.float32))
    assert K(CastMap, device)({}).numpy().shape == (1, 0)


def test_cast_map_errors(device):
    with pytest.raises(KernelInputError, match="CastMap.*max_map"):
        K(CastMap, device)({5: 1.0}, map_form="SPARSE", max_map=3)
    with pytest.raises(KernelInputError, match="CastMap.*cast_to"):
        K(CastMap, device)({1: 1.0}, cast_to="TO_BOOL")
    with pytest.raises(KernelTypeError, match="CastMap"):
        K(CastMap, device)(np.zeros(3))
    with pytest.raises(KernelInputError, match="CastMap.*same size"):
        K(CastMap, device)([{1: 1.0}, {1: 2.0, 2: 3.0}])


def test_category_mapper(device, rng):
    cats_s, cats_i = ["cat", "dog", "cow", "dog"], [3, 7, 1, 9]
    words = np.array(rng.choice(["cat", "dog", "cow", "emu"], size=(3, 4)), dtype=object)
    y = K(CategoryMapper, device)(words, cats_int64s=cats_i, cats_strings=cats_s, default_int64=-5).numpy()
    ref = {"cat": 3, "dog": 9, "cow": 1}  # a repeated key: the last pair wins
    np.testing.assert_array_equal(y, np.vectorize(lambda w: ref.get(w, -5))(words))
    attrs = dict(cats_int64s=cats_i, cats_strings=cats_s, default_int64=-5)
    np.testing.assert_array_equal(y, run_ml_node("CategoryMapper", [words], attrs)[0])
    ints = rng.integers(0, 10, size=(5,))
    s = K(CategoryMapper, device)(ints, cats_int64s=cats_i, cats_strings=cats_s, default_string="?").numpy()
    rev = {3: "cat", 7: "dog", 1: "cow", 9: "dog"}
    assert s.tolist() == [rev.get(int(i), "?") for i in ints]
    with pytest.raises(KernelInputError, match="CategoryMapper.*length"):
        K(CategoryMapper, device)(ints, cats_int64s=[1], cats_strings=["a", "b"])


def test_dict_vectorizer(device):
    y = K(DictVectorizer, device)({"a": 4.0, "c": 8.0, "q": 1.0}, string_vocabulary=["a", "c", "b", "z"]).numpy()
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, [[4, 8, 0, 0]])
    np.testing.assert_array_equal(
        y, run_ml_node("DictVectorizer", [{"a": 4.0, "c": 8.0}], dict(string_vocabulary=["a", "c", "b", "z"]))[0])
    y = K(DictVectorizer, device)([{2: np.float64(1.5)}, {5: np.float64(2.5)}], int64_vocabulary=[5, 2]).numpy()
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, [[0, 1.5], [2.5, 0]])
    y = K(DictVectorizer, device)({"x": 3}, string_vocabulary=["y", "x"]).numpy()
    assert y.dtype == np.int64 and y.tolist() == [[0, 3]]
    with pytest.raises(KernelInputError, match="DictVectorizer.*vocabulary"):
        K(DictVectorizer, device)({"x": 1.0})
    with pytest.raises(KernelTypeError, match="DictVectorizer.*key"):
        K(DictVectorizer, device)({1: 1.0}, string_vocabulary=["a"])


def test_label_encoder_v1(device):
    x = np.array(["b", "z", "a", "b"], dtype=object)
    y = K(LabelEncoder, device, 1)(x, classes_strings=["a", "b", "c"], default_int64=-9).numpy()
    np.testing.assert_array_equal(y, [1, -9, 0, 1])
    s = K(LabelEncoder, device, 1)(np.array([2, 5, -1, 0]), classes_strings=["a", "b", "c"],
                                    default_string="none").numpy()
    assert s.tolist() == ["c", "none", "none", "a"]


def _le_ref(x, keys, values, default):
    table = {}
    for k, v in zip(keys, values):
        table[k] = v  # last wins
    out = []
    for v in x.reshape(-1).tolist():
        if isinstance(v, float) and np.isnan(v):
            hit = [table[k] for k in table if isinstance(k, float) and np.isnan(k)]
            out.append(hit[-1] if hit else default)
        else:
            out.append(table.get(v, default))
    return out


@pytest.mark.parametrize("kind", ["float_int", "int_string", "string_float", "int_float"])
def test_label_encoder_v2(device, rng, kind):
    if kind == "float_int":
        keys = [0.5, -1.0, np.nan, 2.0, 0.5]
        attrs = dict(keys_floats=keys, values_int64s=[1, 2, 3, 4, 5], default_int64=-7)
        x = np.array([0.5, 2.0, np.nan, 3.0, -1.0, 0.0], np.float32)
        want = _le_ref(x.astype(np.float64), [np.float64(np.float32(k)) for k in keys], [1, 2, 3, 4, 5], -7)
    elif kind == "int_string":
        attrs = dict(keys_int64s=[5, 3, 9], values_strings=["five", "three", "nine"], default_string="?")
        x = rng.integers(0, 10, size=(2, 5))
        want = _le_ref(x, [5, 3, 9], ["five", "three", "nine"], "?")
    elif kind == "string_float":
        attrs = dict(keys_strings=["x", "y"], values_floats=[1.5, -2.5], default_float=0.25)
        x = np.array([["x", "w"], ["y", "x"]], dtype=object)
        want = _le_ref(x, ["x", "y"], [1.5, -2.5], 0.25)
    else:
        attrs = dict(keys_int64s=[1, 2, 1], values_floats=[1.0, 2.0, 3.0])
        x = np.array([1, 2, 3], np.int64)
        want = [3.0, 2.0, -0.0]
    for version in (2, 4):
        y = K(LabelEncoder, device, version)(x, **attrs).numpy()
        assert y.shape == x.shape
        assert y.reshape(-1).tolist() == pytest.approx(want) if y.dtype != object else y.reshape(-1).tolist() == want
        # float_int has NaN keys; int_float a repeated key, where the opset-4 spec says the
        # last pair wins and onnxruntime keeps the first: both checked against _le_ref only
        if kind not in ("float_int", "int_float"):
            r = run_ml_node("LabelEncoder", [x], attrs, opset_ml=version)[0]
            np.testing.assert_array_equal(y, r)


@pytest.mark.parametrize("ktype,vtype", [(TensorProto.INT16, TensorProto.DOUBLE),
                                         (TensorProto.INT32, TensorProto.STRING),
                                         (TensorProto.DOUBLE, TensorProto.INT32),
                                         (TensorProto.STRING, TensorProto.INT16)])
def test_label_encoder_v4_tensors(device, rng, ktype, vtype):
    from onnx import helper as h
    from onnx.helper import tensor_dtype_to_np_dtype as np_of
    kd, vd = np_of(ktype), np_of(vtype)
    strk, strv = ktype == TensorProto.STRING, vtype == TensorProto.STRING
    keys = np.array(["k0", "k1", "k2"], dtype=object) if strk else np.array([4, -2, 7]).astype(kd)
    vals = np.array(["v0", "v1", "v2"], dtype=object) if strv else np.array([10, 20, 30]).astype(vd)
    default = np.array(["dflt"], dtype=object) if vtype == TensorProto.STRING else np.array([-99]).astype(vd)
    attrs = dict(keys_tensor=h.make_tensor("k", ktype, (3,), keys.tolist()),
                 values_tensor=h.make_tensor("v", vtype, (3,), vals.tolist()),
                 default_tensor=h.make_tensor("d", vtype, (1,), default.tolist()))
    x = np.array(rng.choice(list(keys) + (["zz"] if strk else [99]), size=(2, 4)), dtype=kd)
    y = K(LabelEncoder, device, 4)(x, **{k: Tensor.from_proto(v) for k, v in attrs.items()}).numpy()
    table = dict(zip(keys.tolist(), vals.tolist()))
    want = [table.get(v, default[0]) for v in x.reshape(-1).tolist()]
    assert y.dtype == (object if vtype == TensorProto.STRING else vd)
    assert y.reshape(-1).tolist() == want
    r = run_ml_node_if_implemented("LabelEncoder", [x], attrs, opset_ml=4)
    if r is not None:
        np.testing.assert_array_equal(y, r[0])
    # without default_tensor: "_Unused" / -1 / -0.0 by the values' type
    attrs.pop("default_tensor")
    y = K(LabelEncoder, device, 4)(x, **{k: Tensor.from_proto(v) for k, v in attrs.items()}).numpy()
    implicit = "_Unused" if vtype == TensorProto.STRING else (-0.0 if vtype == TensorProto.DOUBLE else -1)
    assert y.reshape(-1).tolist() == [table.get(v, implicit) for v in x.reshape(-1).tolist()]
    r = run_ml_node_if_implemented("LabelEncoder", [x], attrs, opset_ml=4)
    if r is not None:
        np.testing.assert_array_equal(y, r[0])


def test_label_encoder_errors(device):
    with pytest.raises(KernelInputError, match="LabelEncoder.*keys"):
        K(LabelEncoder, device, 2)(np.array([1]), values_int64s=[1])
    with pytest.raises(KernelTypeError, match="LabelEncoder.*keys are"):
        K(LabelEncoder, device, 2)(np.array([1.0], np.float32), keys_int64s=[1], values_int64s=[1])
    with pytest.raises(KernelInputError, match="LabelEncoder.*length"):
        K(LabelEncoder, device, 2)(np.array([1]), keys_int64s=[1, 2], values_int64s=[1])
    with pytest.raises(KernelTypeError, match="LabelEncoder"):
        K(LabelEncoder, device, 2)(np.array([1], np.int32), keys_int64s=[1], values_int64s=[1])


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32, np.float64])
def test_one_hot_encoder_numeric(device, rng, dtype):
    cats = [4, 1, 7]
    x = rng.choice([4, 1, 7, 3], size=(2, 3)).astype(dtype)
    if dtype in (np.float32, np.float64):
        x = x + 0.4  # truncated toward zero
    y = K(OneHotEncoder, device)(x, cats_int64s=cats).numpy()
    want = (np.trunc(x.astype(np.float64))[..., None] == np.array(cats)).astype(np.float32)
    assert y.dtype == np.float32 and y.shape == (2, 3, 3)
    np.testing.assert_array_equal(y, want)
    r = run_ml_node_if_implemented("OneHotEncoder", [x], dict(cats_int64s=cats))
    if r is not None:
        np.testing.assert_array_equal(y, r[0])
    with pytest.raises(KernelInputError, match="OneHotEncoder.*category"):
        K(OneHotEncoder, device)(np.array([3], dtype), cats_int64s=cats, zeros=0)


def test_one_hot_encoder_strings(device):
    x = np.array(["a", "q", "c"], dtype=object)
    y = K(OneHotEncoder, device)(x, cats_strings=["c", "a"]).numpy()
    np.testing.assert_array_equal(y, [[0, 1], [0, 0], [1, 0]])
    np.testing.assert_array_equal(y, run_ml_node("OneHotEncoder", [x], dict(cats_strings=["c", "a"]))[0])
    with pytest.raises(KernelTypeError, match="OneHotEncoder"):
        K(OneHotEncoder, device)(x, cats_int64s=[1])
    assert K(OneHotEncoder, device)(np.zeros((0, 2), np.int64), cats_int64s=[1]).numpy().shape == (0, 2, 1)


def test_zipmap(device, rng):
    x = rng.random((3, 2)).astype(np.float32)
    z = K(ZipMap, device)(x, classlabels_strings=["no", "yes"])
    assert z == [{"no": float(r[0]), "yes": float(r[1])} for r in x]
    z = K(ZipMap, device)(x, classlabels_int64s=[7, 9])
    ref = run_ml_node("ZipMap", [x], dict(classlabels_int64s=[7, 9]))[0]
    assert [{k: pytest.approx(v) for k, v in d.items()} for d in ref] == z
    assert K(ZipMap, device)(x[0], classlabels_int64s=[7, 9]) == [{7: float(x[0, 0]), 9: float(x[0, 1])}]
    with pytest.raises(KernelInputError, match="ZipMap.*columns"):
        K(ZipMap, device)(x, classlabels_int64s=[1, 2, 3])
    with pytest.raises(KernelInputError, match="ZipMap.*exactly one"):
        K(ZipMap, device)(x)
