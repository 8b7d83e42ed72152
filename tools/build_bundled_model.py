"""Build gpukernels/models/hybrid_block.onnx, the model `gpukernels run` uses by default.

A small hybrid vision model, the shape of the blocks current models are made of:
a convolutional stem (Conv, BatchNormalization, Relu, MaxPool) turns a 3x32x32 image
into 64 tokens of width 64; a softmax-attention block (LayerNormalization, a fused QKV
projection, RotaryEmbedding on Q and K, Attention with 4 heads) and a gated-delta
linear-attention block (LinearAttention with L2-normalised keys, log-space decay and a
sigmoid update rate), each with a residual connection; then mean pooling and a
classifier (Gemm + Softmax) over 10 classes.

Weights are drawn once from a fixed seed with the initialisations such layers are
trained from (He for convolutions, scaled normal for projections, BatchNorm statistics
near their trained ranges), so activations keep realistic magnitudes through the whole
network.  The file is checked in; this script documents how it was made:

    python tools/build_bundled_model.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parents[1] / "gpukernels" / "models" / "hybrid_block.onnx"
OPSET = 27
D, HEADS, TOKENS, CLASSES = 64, 4, 64, 10
HEAD = D // HEADS


def build(seed: int = 20261129) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    def proj(shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    def node(op, inputs, outputs, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{len(nodes)}", **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    # ---- convolutional stem: 3x32x32 -> 64x8x8
    x = node("Conv", ["image", const("stem1.w", he((32, 3, 3, 3), 27)),
                      const("stem1.b", (rng.standard_normal(32) * 0.05).astype(np.float32))],
             ["stem1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    x = node("Relu", [x], ["stem1.act"])
    x = node("Conv", [x, const("stem2.w", he((D, 32, 3, 3), 288))], ["stem2"],
             kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = node("BatchNormalization", [x, const("bn.scale", (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)),
                                    const("bn.bias", (0.1 * rng.standard_normal(D)).astype(np.float32)),
                                    const("bn.mean", (0.2 * rng.standard_normal(D)).astype(np.float32)),
                                    const("bn.var", rng.uniform(0.5, 2.0, D).astype(np.float32))],
             ["bn"], epsilon=1e-5)
    x = node("Relu", [x], ["bn.act"])
    x = node("MaxPool", [x], ["pool"], kernel_shape=[2, 2], strides=[2, 2])
    x = node("Reshape", [x, const("tokens.shape", np.array([1, D, TOKENS], np.int64))], ["tokens.cm"])
    tokens = node("Transpose", [x], ["tokens"], perm=[0, 2, 1])  # (1, 64 tokens, 64)

    # ---- softmax attention block with rotary position embedding
    h = node("LayerNormalization", [tokens, const("ln1.g", np.ones(D, np.float32)),
                                    const("ln1.b", np.zeros(D, np.float32))], ["ln1"], axis=-1)
    qkv = node("MatMul", [h, const("attn.wqkv", proj((D, 3 * D)))], ["qkv"])
    q, k, v = node("Split", [qkv, const("qkv.split", np.array([D, D, D], np.int64))], ["q", "k", "v"], axis=-1)
    heads_shape = const("heads.shape", np.array([1, TOKENS, HEADS, HEAD], np.int64))
    q4 = node("Transpose", [node("Reshape", [q, heads_shape], ["q.r"])], ["q4"], perm=[0, 2, 1, 3])
    k4 = node("Transpose", [node("Reshape", [k, heads_shape], ["k.r"])], ["k4"], perm=[0, 2, 1, 3])
    v4 = node("Transpose", [node("Reshape", [v, heads_shape], ["v.r"])], ["v4"], perm=[0, 2, 1, 3])
    pos = np.arange(TOKENS)[:, None] / (10000 ** (np.arange(HEAD // 2) / (HEAD // 2)))[None, :]
    cos = const("rope.cos", np.cos(pos).astype(np.float32))
    sin = const("rope.sin", np.sin(pos).astype(np.float32))
    pid = const("rope.position_ids", np.arange(TOKENS, dtype=np.int64)[None, :])
    q4 = node("RotaryEmbedding", [q4, cos, sin, pid], ["q.rope"])
    k4 = node("RotaryEmbedding", [k4, cos, sin, pid], ["k.rope"])
    att = node("Attention", [q4, k4, v4], ["attn"])
    att = node("Transpose", [att], ["attn.t"], perm=[0, 2, 1, 3])
    att = node("Reshape", [att, const("attn.shape", np.array([1, TOKENS, D], np.int64))], ["attn.r"])
    att = node("MatMul", [att, const("attn.wo", proj((D, D)) * 0.5)], ["attn.o"])
    tokens = node("Add", [tokens, att], ["res1"])

    # ---- gated-delta linear attention block
    h = node("LayerNormalization", [tokens, const("ln2.g", np.ones(D, np.float32)),
                                    const("ln2.b", np.zeros(D, np.float32))], ["ln2"], axis=-1)
    lq = node("MatMul", [h, const("la.wq", proj((D, D)))], ["la.q"])
    lk = node("MatMul", [h, const("la.wk", proj((D, D)))], ["la.k"])
    lv = node("MatMul", [h, const("la.wv", proj((D, D)))], ["la.v"])
    # keys L2-normalised per head, as the delta rules expect
    lk4 = node("Reshape", [lk, heads_shape], ["la.k4"])
    lk4 = node("LpNormalization", [lk4], ["la.k4n"], axis=-1, p=2)
    lk = node("Reshape", [lk4, const("la.kshape", np.array([1, TOKENS, D], np.int64))], ["la.kn"])
    gate = node("MatMul", [h, const("la.wg", proj((D, HEADS)))], ["la.g.lin"])
    decay = node("Neg", [node("Softplus", [gate], ["la.g.sp"])], ["la.decay"])  # log(sigmoid(-g)) < 0
    beta = node("Sigmoid", [node("MatMul", [h, const("la.wb", proj((D, HEADS)))], ["la.b.lin"])], ["la.beta"])
    lo, _state = node("LinearAttention", [lq, lk, lv, "", decay, beta], ["la.out", "la.state"],
                      q_num_heads=HEADS, kv_num_heads=HEADS, update_rule="gated_delta", chunk_size=16)
    lo = node("MatMul", [lo, const("la.wo", proj((D, D)) * 0.5)], ["la.o"])
    tokens = node("Add", [tokens, lo], ["res2"])

    # ---- head
    pooled = node("ReduceMean", [tokens, const("pool.axes", np.array([1], np.int64))], ["pooled"], keepdims=0)
    logits = node("Gemm", [pooled, const("head.w", proj((D, CLASSES))),
                           const("head.b", np.zeros(CLASSES, np.float32))], ["logits"])
    node("Softmax", [logits], ["probabilities"], axis=-1)

    graph = helper.make_graph(
        nodes, "hybrid_block",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, CLASSES]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="gpukernels tools/build_bundled_model.py")
    model.ir_version = 10
    model.doc_string = __doc__.split("\n\n")[1]
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    m = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1024:.0f} KiB, {len(m.graph.node)} nodes)")
