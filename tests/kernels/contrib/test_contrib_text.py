"""com.microsoft Tokenizer against onnxruntime's CPU kernel (one node per case: separators
in order, leftmost-longest matches, mincharnum, character mode, marks, padding, empty
inputs), its refusals, and scikit-learn's text vectorizers exported by skl2onnx run end
to end against scikit-learn's own matrices: stored exports and outputs
(tests/data/sklearn_text, always), and fresh ones where scikit-learn and skl2onnx are
installed (onnxruntime's StringNormalizer needs an installed en_US.UTF-8 locale, which
this machine lacks, so onnxruntime cannot be the reference there)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.contrib.text import Tokenizer

from tests.ort_reference import run_gk, run_ort, single_node_model

load_all()

BASE = {"mark": 0, "mincharnum": 1, "pad_value": "#"}

CASES = [
    (["Hello World", "I love  computer science !"], {"separators": [" "]}),
    (["Hello World", "I love  computer science !"], {"tokenexp": "[a-zA-Z]+"}),
    (["Hello World", "I love computer"], {"separators": [" "], "mark": 1}),
    (["", "a b"], {"separators": [" "], "mark": 1}),
    (["", "a b"], {"tokenexp": "[a-z]", "mark": 1}),
    (["", ""], {"separators": [" "], "mark": 1}),
    (["", "  "], {"separators": [" "]}),
    (["ab c", "defg"], {"separators": [" "], "mincharnum": 2}),
    (["héllo wörld ñ", "日本語 テキスト"], {"separators": [" "], "mincharnum": 3}),
    (["abc", "de", "日本語", "a\nb"], {"separators": [""]}),
    (["abc", "de", "a\nb"], {"tokenexp": "."}),
    ([["a b", "c"], ["d e f", ""]], {"separators": [" "]}),
    ([["a b"], ["c d e"]], {"separators": [" "], "mark": 1}),
    (["a,b;;c", "a-b c"], {"separators": [",", ";", "-", " "]}),
    (["xabx", "xaby"], {"separators": ["a", "ab"]}),
    (["xabx", "xaby"], {"separators": ["ab", "a"]}),
    (["xaby"], {"separators": ["b", "ab"]}),
    (["x12y", "x1y22z"], {"separators": ["1|12", "[0-9]+"]}),
    (["a.b", "a..b", "ab", "a b\tc"], {"separators": ["\\.", "^a", "\\s"]}),
    (["a1b22c333", "ab12cd", "aaa", "hello"], {"tokenexp": "[0-9]+|[a-z]+[0-9]+|l+"}),
    (["a1b22c333"], {"tokenexp": "[a-z]*"}),
    (["aaa"], {"tokenexp": "a|aa"}),
    (["Hello World"], {"tokenexp": "\\b"}),
    (["abab"], {"separators": ["ab"]}),
    (["a b"], {"separators": [" "], "pad_value": ""}),
    (["one two"], {"separators": [" "], "tokenexp": "o"}),  # both set: the separators
]


@pytest.mark.parametrize("x,attrs", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_tokenizer_vs_ort(device, x, attrs):
    x = np.array(x, dtype=object)
    model = single_node_model("Tokenizer", [("x", x)], {**BASE, **attrs})
    want = run_ort(model, {"x": x})[0]
    got = run_gk(model, {"x": x}, device=device)[0]
    assert got.shape == want.shape and got.dtype == object
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("shape", [(0,), (2, 0)])
def test_tokenizer_empty_input_keeps_its_shape(device, shape):
    x = np.empty(shape, dtype=object)
    model = single_node_model("Tokenizer", [("x", x)], {**BASE, "separators": [" "]})
    assert run_ort(model, {"x": x})[0].shape == shape
    assert run_gk(model, {"x": x}, device=device)[0].shape == shape


@pytest.mark.parametrize("attrs,match", [
    ({}, "one of the attributes 'separators' and 'tokenexp'"),
    ({"separators": [" "], "mincharnum": 0}, "mincharnum must be at least 1"),
    ({"separators": [""], "mincharnum": 2}, "character mode"),
    ({"tokenexp": "."}, None),
    ({"tokenexp": "("}, "invalid RE2 tokenexp '\\('"),
    ({"separators": ["("]}, "invalid RE2 separator"),
    ({"separators": ["b*"]}, "separator 'b\\*' matches the empty string"),
    ({"separators": ["", " "]}, "separator '' matches the empty string"),
    ({"separators": [" "], "bogus": 1}, "unknown attribute"),
    ({"separators": " ,"}, "'separators' must be a list of strings"),
    ({"tokenexp": ["a"]}, "'tokenexp' must be a string"),
    ({"separators": [" "], "mark": "yes"}, "'mark' must be an int"),
    ({"separators": [" "], "pad_value": 0}, "'pad_value' must be a string"),
])
def test_tokenizer_refusals(attrs, match):
    k = Tokenizer(KernelContext("cpu"))
    x = np.array(["a b"], dtype=object)
    if match is None:
        assert k(x, **{**BASE, **attrs}).numpy().tolist() == [["a", " ", "b"]]
        return
    with pytest.raises(KernelInputError, match=match) as info:
        k(x, **{**BASE, **attrs})
    assert "Tokenizer" in str(info.value)


@pytest.mark.parametrize("attrs", [{"separators": [""]}, {"tokenexp": "[a-z]"}, {"separators": [" "]}])
def test_tokenizer_output_limit_is_checked_as_tokens_come(attrs):
    """One long string whose tokens would pass max_tensor_bytes is refused while it is
    split (its token list never grows past the limit), in character, expression and
    separator modes."""
    from gpukernels.errors import GpuKernelsError, ResourceLimitError

    x = np.array(["a b " * 50_000, "c"], dtype=object)
    model = single_node_model("Tokenizer", [("x", x)], {**BASE, **attrs})
    with pytest.raises(GpuKernelsError, match="max_tensor_bytes") as info:
        run_gk(model, {"x": x}, max_tensor_bytes=1 << 16)
    assert isinstance(info.value, ResourceLimitError) or isinstance(info.value.__cause__, ResourceLimitError)
    assert "[2, 4097]" in str(info.value)  # stopped at the first token past the limit
    short = np.array(["a b " * 100, "c"], dtype=object)
    assert run_gk(model, {"x": short}, max_tensor_bytes=1 << 16)[0].shape[0] == 2


def test_tokenizer_many_separators():
    """Thousands of separators (each applied in turn, without recursion)."""
    seps = [f"x{i}y" for i in range(5000)] + [" "]
    k = Tokenizer(KernelContext("cpu"))
    got = k(np.array(["a x17y b x4999yc d"], dtype=object), **BASE, separators=seps).numpy()
    assert got.tolist() == [["a", "b", "c", "d"]]


def test_tokenizer_input_checks():
    k = Tokenizer(KernelContext("cpu"))
    with pytest.raises(KernelTypeError, match="string tensor"):
        k(np.zeros(3, np.float32), **BASE, separators=[" "])
    with pytest.raises(KernelInputError, match="rank 3"):
        k(np.array([[["a"]]], dtype=object), **BASE, separators=[" "])
    with pytest.raises(KernelInputError, match="'pad_value' is required"):
        k(np.array(["a"], dtype=object), mark=0, mincharnum=1, separators=[" "])


_TEXT_DATA = Path(__file__).resolve().parents[2] / "data" / "sklearn_text"


@pytest.mark.parametrize("name", ["tfidf_words", "count_bigrams", "tfidf_chars"])
def test_sklearn_text_exports_match_sklearn(device, name):
    """Stored skl2onnx exports (tests/data/sklearn_text) against scikit-learn's stored
    matrices for the same queries, an empty string among them (no scikit-learn needed)."""
    queries = json.loads((_TEXT_DATA / "index.json").read_text())["queries"]
    want = np.load(_TEXT_DATA / f"{name}.expected.npy")
    got = run_gk(str(_TEXT_DATA / f"{name}.onnx"), {"text": np.array(queries, dtype=object).reshape(-1, 1)},
                 device=device)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore:The conversion of CountVectorizer may not work")
@pytest.mark.parametrize("vectorizer", ["tfidf", "count_bigrams", "tfidf_char"])
def test_sklearn_text_vectorizers_run_end_to_end(device, vectorizer):
    """skl2onnx's TfidfVectorizer / CountVectorizer graphs (StringNormalizer, Tokenizer,
    TfIdfVectorizer, Normalizer) give scikit-learn's own matrices."""
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

    docs = ["The cat sat on the mat", "a dog barked at the cat!", "the Quick brown fox",
            "cats and dogs, dogs and cats", "lorem ipsum dolor sit amet"] * 4
    est = {"tfidf": TfidfVectorizer(), "count_bigrams": CountVectorizer(ngram_range=(1, 2)),
           "tfidf_char": TfidfVectorizer(analyzer="char", ngram_range=(1, 2))}[vectorizer]
    est.fit(docs)
    try:
        model = skl2onnx.convert_sklearn(est, initial_types=[("text", StringTensorType([None, 1]))],
                                         target_opset={"": 17, "ai.onnx.ml": 3})
    except Exception as exc:  # noqa: BLE001 -- a converter without this option
        pytest.skip(f"skl2onnx cannot convert {vectorizer}: {exc}")
    queries = ["the cat and the dog", "brown fox sat", "nothing known here", "CATS cats Cats"]
    got = run_gk(model, {"text": np.array(queries, dtype=object).reshape(-1, 1)}, device=device)[0]
    np.testing.assert_allclose(got, est.transform(queries).toarray(), rtol=1e-5, atol=1e-6)
