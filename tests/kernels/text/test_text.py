"""String kernels and TfIdfVectorizer against plain-Python references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpukernels.dtypes import DataType as D
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.text.strings import RegexFullMatch, StringConcat, StringNormalizer, StringSplit
from gpukernels.kernels.text.tfidf import TfIdfVectorizer

WORDS = ["", "a", "Ab", "hello world", "  x  y ", "ÄÖü", "ǅ", "straße", "--a--b-", "İstanbul"]


def S(items, shape=None):
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr.reshape(shape if shape is not None else (len(items),))


def test_string_concat_broadcast(device):
    x = S(WORDS[:6], (2, 3))
    y = S(["!", "é", ""], (3,))
    z = StringConcat(KernelContext(device))(x, y)
    assert z.data_type == D.STRING and z.shape == (2, 3)
    for i, j in itertools.product(range(2), range(3)):
        assert z.numpy()[i, j] == x[i, j] + y[j]
    assert StringConcat(KernelContext(device))(S(["a"]).reshape(()), S(["b"]).reshape(())).numpy() == "ab"
    assert StringConcat(KernelContext(device))(S([], (0,)), S(["b"])).shape == (0,)
    with pytest.raises(KernelInputError, match="StringConcat.*broadcast"):
        StringConcat(KernelContext(device))(S(["a", "b"]), S(["a", "b", "c"]))
    with pytest.raises(KernelTypeError, match="StringConcat"):
        StringConcat(KernelContext(device))(np.zeros(2, np.int64), S(["a", "b"]))


@pytest.mark.parametrize("delimiter", [None, "", "-", " ", "ab"])
@pytest.mark.parametrize("maxsplit", [None, 0, 1, 3])
def test_string_split(device, delimiter, maxsplit):
    x = S(WORDS + ["ab-ab", "x ab y"], (3, 4))
    y, z = StringSplit(KernelContext(device))(x, delimiter=delimiter, maxsplit=maxsplit)
    sep = delimiter if delimiter else None
    parts = [[s.split(sep, -1 if maxsplit is None else maxsplit)] for s in x.ravel()]
    parts = [p[0] for p in parts]
    width = max(len(p) for p in parts)
    assert y.shape == (3, 4, width) and z.dtype == np.int64
    for k, p in enumerate(parts):
        i, j = divmod(k, 4)
        assert z.numpy()[i, j] == len(p)
        assert list(y.numpy()[i, j]) == p + [""] * (width - len(p))


@pytest.mark.parametrize("delimiter,maxsplit,refused", [(None, None, True), (",", None, True), (",", 3, False),
                                                       (None, 2, False)])
def test_string_split_output_limit_is_checked_before_splitting(delimiter, maxsplit, refused):
    """A string that would split into more pieces than max_tensor_bytes allows is refused
    before it is split; maxsplit bounds the pieces and lets it through."""
    from gpukernels.errors import ResourceLimitError

    text = ("a b," * 20_000) if delimiter else ("a b " * 20_000)
    k = StringSplit(KernelContext("cpu", options={"max_tensor_bytes": 1 << 16}))
    if refused:
        with pytest.raises(ResourceLimitError, match="max_tensor_bytes"):
            k(S([text, "c"]), delimiter=delimiter, maxsplit=maxsplit)
    else:
        y, z = k(S([text, "c"]), delimiter=delimiter, maxsplit=maxsplit)
        assert y.shape[1] == maxsplit + 1 and z.numpy().tolist() == [maxsplit + 1, 1]


def test_string_split_edge(device):
    y, z = StringSplit(KernelContext(device))(S([], (0,)))
    assert y.shape == (0, 0) and z.shape == (0,)
    y, z = StringSplit(KernelContext(device))(S(["a b"]).reshape(()))
    assert y.shape == (2,) and int(z.numpy()) == 2
    with pytest.raises(KernelInputError, match="StringSplit.*maxsplit"):
        StringSplit(KernelContext(device))(S(["a"]), maxsplit=-1)


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
@pytest.mark.parametrize("two_d", [False, True])
def test_string_normalizer(device, action, sensitive, two_d):
    words = ["Monday", "tuesday", "MONDAY", "straße", "ǅ", "x", "İstanbul"]
    stop = ["monday", "ISTANBUL", "x"]
    x = S(words, (1, len(words)) if two_d else None)
    y = StringNormalizer(KernelContext(device))(x, case_change_action=action, is_case_sensitive=sensitive,
                                                stopwords=stop)
    if sensitive:
        kept = [w for w in words if w not in stop]
    else:
        kept = [w for w in words if w.lower() not in {s.lower() for s in stop}]
    kept = [w.lower() if action == "LOWER" else w.upper() if action == "UPPER" else w for w in kept]
    assert y.shape == ((1, len(kept)) if two_d else (len(kept),))
    assert list(y.numpy().ravel()) == kept


def test_string_normalizer_all_removed_and_errors(device):
    k = StringNormalizer(KernelContext(device))
    assert list(k(S(["a", "A"]), stopwords=["a"]).numpy()) == [""]
    assert k(S(["a"], (1, 1)), stopwords=["a"]).shape == (1, 1)
    with pytest.raises(KernelInputError, match="StringNormalizer.*case_change_action"):
        k(S(["a"]), case_change_action="TITLE")
    with pytest.raises(KernelInputError, match=r"\[1, C\]"):
        k(S(["a", "b", "c", "d"], (2, 2)))


@pytest.mark.parametrize("pattern", [r"www\.[\w.-]+\.\bcom\b", r"a+b*", r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)",
                                     r"[0-9]{2,3}", r".*", r"(?P<x>ab)+"])
def test_regex_full_match(device, pattern):
    # Syntax RE2 and Python's re share, on texts where their semantics agree.
    import re
    x = S(["www.google.com", "aab", "b", "12", "1234", "", "abab", "me@gmail.com", "Ä"], (3, 3))
    y = RegexFullMatch(KernelContext(device))(x, pattern=pattern)
    assert y.dtype == np.bool_ and y.shape == (3, 3)
    exp = [re.fullmatch(pattern, s) is not None for s in x.ravel()]
    assert list(y.numpy().ravel()) == exp


@pytest.mark.parametrize("pattern, texts, expected", [
    (r"\pL+", ["héllo", "ÄÖü", "a1", ""], [True, True, False, False]),
    (r"\p{Greek}+", ["αβγ", "abc"], [True, False]),
    (r"[[:alpha:]]+[[:digit:]]", ["abc1", "abc", "1"], [True, False, False]),
    (r"\Qa.b\E", ["a.b", "axb"], [True, False]),
    (r"\w+", ["abc_1", "Ä", "straße"], [True, False, False]),  # RE2's \w is ASCII
    (r"a.b", ["axb", "a\nb"], [True, False]),  # '.' does not match a newline
    (r"(?s)a.b", ["a\nb"], [True]),
    (r"(?i)abc", ["ABC", "abd"], [True, False]),
    (r"(?U)a+", ["aaa"], [True]),  # non-greedy swap does not change a full match
    (r"ab\z", ["ab", "ab\n"], [True, False]),
    (r"a|ab", ["ab", "a"], [True, True]),  # full match, not the leftmost-first prefix
    (r"\x{41}\x42", ["AB"], [True]),
])
def test_regex_full_match_re2_syntax(device, pattern, texts, expected):
    y = RegexFullMatch(KernelContext(device))(S(texts), pattern=pattern)
    assert list(y.numpy()) == expected


def _run_with_deadline(code, seconds=120):
    """Run code in a fresh interpreter and return what it prints (JSON).  A backtracking
    regex engine holds the GIL, so a thread cannot guard it: a child process with a
    timeout makes a regression fail the test instead of hanging the suite."""
    import json
    import subprocess
    import sys
    import textwrap

    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                              text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not finish within {seconds} s (exponential regex matching?)")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_regex_full_match_is_linear_time():
    # Exponential for a backtracking engine on these texts (minutes at 40 characters);
    # RE2 answers in microseconds.
    got = _run_with_deadline("""
        import json
        import numpy as np
        from gpukernels.kernels.base import KernelContext
        from gpukernels.kernels.text.strings import RegexFullMatch
        texts = np.array(["a" * 40 + "b", "a" * 64 + "!", "x" * 48, "a" * 5000 + "c"], dtype=object)
        k = RegexFullMatch(KernelContext("cpu"))
        out = {p: k(texts, pattern=p).numpy().tolist()
               for p in [r"(a+)+$", r"(a|aa)+", r"(a*)*b", r"(x+x+)+y"]}
        print(json.dumps(out))
    """)
    assert got == {r"(a+)+$": [False] * 4, r"(a|aa)+": [False] * 4,
                   r"(a*)*b": [True, False, False, False], r"(x+x+)+y": [False] * 4}


def test_regex_constant_input_folds_at_session_creation():
    # A constant input makes constant folding run the kernel inside Session() (its output
    # is an intermediate, so it folds): it must finish, with the right answer, instead of
    # hanging the constructor.
    got = _run_with_deadline("""
        import json
        import numpy as np
        import onnx
        from onnx import TensorProto, helper
        from gpukernels.runtime import Session
        const = helper.make_tensor("x", TensorProto.STRING, [2], [b"a" * 40 + b"b", b"aaa"])
        graph = helper.make_graph(
            [helper.make_node("Constant", [], ["x"], value=const),
             helper.make_node("RegexFullMatch", ["x"], ["m"], pattern="(a+)+$"),
             helper.make_node("Not", ["m"], ["y"])],
            "g", [], [helper.make_tensor_value_info("y", TensorProto.BOOL, [2])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
        onnx.checker.check_model(model)
        session = Session(model, device="cpu")
        assert [p.op_type for p in session.graph.folded] == ["Constant", "RegexFullMatch"], \
            [p.op_type for p in session.graph.folded]
        print(json.dumps(np.asarray(session.run(None, {})[0]).tolist()))
    """)
    assert got == [True, False]


def test_regex_errors(device):
    k = RegexFullMatch(KernelContext(device))
    with pytest.raises(KernelInputError, match=r"RegexFullMatch.*invalid RE2 pattern '\(': missing \)"):
        k(S(["a"]), pattern="(")
    # Perl/Python constructs RE2 does not have: a clear error, never a silent mismatch.
    for bad in [r"(a)\1", r"(?=a)a", r"(?<!b)a", r"a\Z", r"(?P<n>a)(?P=n)", "a{2,1}", "a{1001}"]:
        with pytest.raises(KernelInputError, match=r"RegexFullMatch: invalid RE2 pattern") as info:
            k(S(["a"]), pattern=bad)
        assert repr(bad) in str(info.value)
    with pytest.raises(KernelInputError, match="pattern"):
        k(S(["a"]))
    assert k(S([], (0, 2)), pattern="a").shape == (0, 2)


def ref_tfidf(rows, pool_groups, indexes, lo, hi, skip, mode, weights):
    """pool_groups: list over n of list of n-tuples; brute force counting."""
    ngrams = [g for group in pool_groups for g in group]
    total = len(ngrams)
    w = weights if weights is not None else [1.0] * total
    width = max(indexes) + 1
    out = np.zeros((len(rows), width), np.float32)
    for r, row in enumerate(rows):
        counts = [0] * total
        for gi, g in enumerate(ngrams):
            n = len(g)
            if not lo <= n <= hi:
                continue
            for sk in range(skip + 1 if n > 1 else 1):
                for i in range(len(row)):
                    pos = [i + j * (sk + 1) for j in range(n)]
                    if pos[-1] < len(row) and tuple(row[p] for p in pos) == g:
                        counts[gi] += 1
        for gi in range(total):
            v = counts[gi] if mode == "TF" else (min(counts[gi], 1) * w[gi] if mode == "IDF" else counts[gi] * w[gi])
            out[r, indexes[gi]] = v
    return out


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("lo,hi", [(1, 1), (1, 2), (2, 3), (1, 3)])
@pytest.mark.parametrize("skip", [0, 1, 3])
@pytest.mark.parametrize("kind", ["int32", "int64", "string"])
def test_tfidf(device, rng, mode, lo, hi, skip, kind):
    vocab = [2, 3, 5, 7, 11]
    rows = rng.choice(vocab + [99], size=(3, 12))
    pool_groups = [[(2,), (5,), (7,), (11,)], [(2, 3), (5, 2), (7, 7), (3, 5)], [(2, 3, 5), (7, 5, 2)]]
    flat = [t for group in pool_groups for g in group for t in g]
    counts = [0, 4, 4 + 8]
    total = sum(len(g) for g in pool_groups)
    indexes = list(rng.permutation(total + 2)[:total])
    weights = list(rng.uniform(0.5, 2, total)) if mode != "TF" else None
    kw = dict(mode=mode, min_gram_length=lo, max_gram_length=hi, max_skip_count=skip, ngram_counts=counts,
              ngram_indexes=indexes, weights=weights)
    if kind == "string":
        x = S([f"w{v}" for v in rows.ravel()], rows.shape)
        kw["pool_strings"] = [f"w{v}" for v in flat]
        ref_rows = [[f"w{v}" for v in r] for r in rows]
        groups = [[tuple(f"w{v}" for v in g) for g in group] for group in pool_groups]
    else:
        x = rows.astype(kind)
        kw["pool_int64s"] = flat
        ref_rows = [list(r) for r in rows]
        groups = pool_groups
    y = TfIdfVectorizer(KernelContext(device))(x, **kw)
    exp = ref_tfidf(ref_rows, groups, indexes, lo, hi, skip, mode, weights)
    np.testing.assert_allclose(y.numpy(), exp, rtol=1e-6)
    y1 = TfIdfVectorizer(KernelContext(device))(x[0], **kw)
    np.testing.assert_allclose(y1.numpy(), exp[0], rtol=1e-6)


def test_tfidf_errors(device):
    k = TfIdfVectorizer(KernelContext(device))
    base = dict(mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0, ngram_counts=[0],
                ngram_indexes=[0, 1], pool_int64s=[1, 2])
    assert k(np.zeros((2, 0), np.int64), **base).shape == (2, 2)
    with pytest.raises(KernelInputError, match="TfIdfVectorizer.*mode"):
        k(np.array([1, 2]), **{**base, "mode": "BM25"})
    with pytest.raises(KernelInputError, match="ngram_indexes"):
        k(np.array([1, 2]), **{**base, "ngram_indexes": [0]})
    with pytest.raises(KernelInputError, match="exactly one"):
        k(np.array([1, 2]), **{**base, "pool_strings": ["a", "b"]})
    with pytest.raises(KernelTypeError, match="string pool"):
        k(S(["a"]), **base)
    with pytest.raises(KernelInputError, match="min_gram_length"):
        k(np.array([1, 2]), **{**base, "min_gram_length": 2})
    with pytest.raises(KernelTypeError):
        k(np.array([1.0, 2.0]), **base)
