"""Models written by onnxruntime's transformer optimizer run end to end: a small BERT-like
encoder built with onnx.helper in the layout PyTorch exports, fused by
onnxruntime.transformers.optimizer.optimize_model into EmbedLayerNormalization, Attention
or MultiHeadAttention, SkipLayerNormalization, BiasGelu or FastGelu (and float16), then run
by onnxruntime and by a gpukernels Session."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.ort_reference import run_gk, run_ort

optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
fusion_options = pytest.importorskip("onnxruntime.transformers.fusion_options")


def build_bert(rng, hidden=32, heads=4, layers=1, vocab=50, max_pos=16, ffn=64, opset=13):
    """A BERT-like encoder in the layout PyTorch exports (LayerNorm, attention with the additive
    -10000 mask, erf Gelu) that onnxruntime's transformer optimizer fuses."""
    h = hidden // heads
    inits, nodes = [], []
    def W(name, *shape, scale=0.2):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)); return name
    def C(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name)); return name
    def N(op, ins, outs, **kw):
        nodes.append(helper.make_node(op, ins, outs, name=outs[0] + "_node", **kw)); return outs[0]
    def layernorm(x, prefix):
        g = W(prefix + "_g", hidden, scale=1.0); b = W(prefix + "_b", hidden, scale=0.1)
        m = N("ReduceMean", [x], [prefix + "_mean"], axes=[-1])
        d = N("Sub", [x, m], [prefix + "_d"])
        p = N("Pow", [d, C(prefix + "_two", 2.0)], [prefix + "_p"])
        v = N("ReduceMean", [p], [prefix + "_var"], axes=[-1])
        e = N("Add", [v, C(prefix + "_eps", 1e-12)], [prefix + "_ve"])
        s = N("Sqrt", [e], [prefix + "_std"])
        n = N("Div", [d, s], [prefix + "_n"])
        y = N("Mul", [n, g], [prefix + "_y"])
        return N("Add", [y, b], [prefix + "_out"])
    # embeddings
    we, pe, te = W("word_emb", vocab, hidden), W("pos_emb", max_pos, hidden), W("type_emb", 2, hidden)
    wg = N("Gather", [we, "input_ids"], ["emb_w"], axis=0)
    shape = N("Shape", ["input_ids"], ["ids_shape"])
    seqlen = N("Gather", [shape, C("one_i", 1, np.int64)], ["seqlen"], axis=0)
    end = N("Unsqueeze", [seqlen, C("ax0", [0], np.int64)], ["seq_end"])
    pos = N("Slice", [C("position_ids", np.arange(max_pos)[None], np.int64), C("s0", [0], np.int64), end,
                      C("s_axes", [1], np.int64), C("s_steps", [1], np.int64)], ["pos_ids"])
    pg = N("Gather", [pe, pos], ["emb_p"], axis=0)
    tg = N("Gather", [te, "token_type_ids"], ["emb_t"], axis=0)
    s1 = N("Add", [wg, tg], ["emb_s1"])
    s2 = N("Add", [s1, pg], ["emb_s2"])
    x = layernorm(s2, "emb_ln")
    # extended attention mask
    m1 = N("Unsqueeze", ["attention_mask", C("ax1", [1], np.int64)], ["mask_u1"])
    m2 = N("Unsqueeze", [m1, C("ax2", [2], np.int64)], ["mask_u2"])
    mc = N("Cast", [m2], ["mask_f"], to=TensorProto.FLOAT)
    ms = N("Sub", [C("one_f", 1.0), mc], ["mask_inv"])
    madd = N("Mul", [ms, C("neg", -10000.0)], ["mask_add"])
    for l in range(layers):
        P = f"l{l}"
        def proj(name, inp, outdim, indim):
            mm = N("MatMul", [inp, W(f"{P}_{name}_w", indim, outdim)], [f"{P}_{name}_mm"])
            return N("Add", [W(f"{P}_{name}_b", outdim, scale=0.1), mm], [f"{P}_{name}_add"])
        shape4 = C(f"{P}_shape4", [0, 0, heads, h], np.int64)
        q = N("Transpose", [N("Reshape", [proj("q", x, hidden, hidden), shape4], [f"{P}_q_r"])], [f"{P}_q_t"], perm=[0, 2, 1, 3])
        k = N("Transpose", [N("Reshape", [proj("k", x, hidden, hidden), shape4], [f"{P}_k_r"])], [f"{P}_k_t"], perm=[0, 2, 3, 1])
        v = N("Transpose", [N("Reshape", [proj("v", x, hidden, hidden), shape4], [f"{P}_v_r"])], [f"{P}_v_t"], perm=[0, 2, 1, 3])
        qk = N("MatMul", [q, k], [f"{P}_qk"])
        qk = N("Div", [qk, C(f"{P}_sqrt_h", float(np.sqrt(h)))], [f"{P}_qk_s"])
        qk = N("Add", [qk, madd], [f"{P}_qk_m"])
        pr = N("Softmax", [qk], [f"{P}_probs"], axis=-1)
        ctx = N("MatMul", [pr, v], [f"{P}_ctx"])
        ctx = N("Transpose", [ctx], [f"{P}_ctx_t"], perm=[0, 2, 1, 3])
        ctx = N("Reshape", [ctx, C(f"{P}_shape3", [0, 0, hidden], np.int64)], [f"{P}_ctx_r"])
        ao = proj("o", ctx, hidden, hidden)
        r1 = N("Add", [ao, x], [f"{P}_res1"])
        x1 = layernorm(r1, f"{P}_ln1")
        f1 = proj("f1", x1, ffn, hidden)
        g1 = N("Div", [f1, C(f"{P}_sqrt2", 1.4142135381698608)], [f"{P}_gd"])
        g2 = N("Erf", [g1], [f"{P}_ge"])
        g3 = N("Add", [g2, C(f"{P}_g1", 1.0)], [f"{P}_ga"])
        g4 = N("Mul", [f1, g3], [f"{P}_gm"])
        g5 = N("Mul", [g4, C(f"{P}_ghalf", 0.5)], [f"{P}_gelu"])
        f2 = proj("f2", g5, hidden, ffn)
        r2 = N("Add", [f2, x1], [f"{P}_res2"])
        x = layernorm(r2, f"{P}_ln2")
    out = N("Identity", [x], ["last_hidden_state"])
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "token_type_ids", "attention_mask")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden])]
    graph = helper.make_graph(nodes, "bert", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model



def _optimized(tmp_path, variant, layers=2):
    rng = np.random.default_rng(7)
    model = build_bert(rng, layers=layers)
    path = tmp_path / "bert.onnx"
    onnx.save(model, str(path))
    options = fusion_options.FusionOptions("bert")
    if variant == "gelu_approximation":
        options.enable_gelu_approximation = True
    elif variant == "multi_head_attention":
        options.use_multi_head_attention = True
    elif variant == "raw_mask":
        options.use_raw_attention_mask(True)
    opt = optimizer.optimize_model(str(path), model_type="bert", num_heads=4, hidden_size=32, opt_level=0,
                                   optimization_options=options)
    if variant == "float16":
        opt.convert_float_to_float16(keep_io_types=True)
    return model, opt.model


EXPECTED = {
    "default": {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"},
    "gelu_approximation": {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "FastGelu"},
    "multi_head_attention": {"EmbedLayerNormalization", "MultiHeadAttention", "SkipLayerNormalization", "BiasGelu"},
    "raw_mask": {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"},
    "float16": {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"},
}


def _feeds(rng, B=3, S=7):
    mask = np.ones((B, S), np.int64)
    mask[1, 4:] = 0
    mask[2, 6:] = 0
    return {"input_ids": rng.integers(0, 50, (B, S)), "token_type_ids": rng.integers(0, 2, (B, S)),
            "attention_mask": mask}


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_optimized_bert_end_to_end(device, tmp_path, variant):
    original, fused = _optimized(tmp_path, variant)
    ops = Counter(n.op_type for n in fused.graph.node if n.domain == "com.microsoft")
    assert EXPECTED[variant] <= set(ops), ops
    feeds = _feeds(np.random.default_rng(3))
    want = run_ort(fused, feeds)[0]
    got = run_gk(fused, feeds, device)[0]
    reference = run_ort(original, feeds)[0]
    tol = dict(rtol=2e-2, atol=2e-2) if variant == "float16" else dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, want, **tol)
    if variant == "gelu_approximation":  # the tanh form replaced the erf form
        tol = dict(rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(got, reference, **tol)
    # the unfused original through gpukernels too
    np.testing.assert_allclose(run_gk(original, feeds, device)[0], reference, rtol=1e-4, atol=1e-4)
