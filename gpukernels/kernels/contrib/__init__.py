"""Operators of onnxruntime's ``com.microsoft`` domain (and the two it defines in the ONNX
domain, SimplifiedLayerNormalization and the opset-1 LayerNormalization) that
onnxruntime's transformer optimizer, its quantizers and onnxruntime-genai write into
models.  Each reuses the ONNX-domain kernels for its math (LayerNormalization,
RMSNormalization, Gelu, Attention, RotaryEmbedding) and checks its inputs itself: onnx has
no schema for these operators, so the runtime binds their attributes as the node gives
them and the kernels fill in the defaults and reject unknown names.

Semantics follow onnxruntime's contrib operator definitions (docs/ContribOperators.md)
and were checked against onnxruntime 1.32's CPU kernels (tests/kernels/contrib).
"""
