"""Kernels of the ai.onnx.preview domain."""
