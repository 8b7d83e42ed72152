"""Kernels of the ai.onnx.preview.training domain: the optimizers Adagrad, Adam and
Momentum, and Gradient (reverse-mode differentiation of the enclosing graph)."""
