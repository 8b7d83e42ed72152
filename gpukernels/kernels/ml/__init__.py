"""Kernels of the ai.onnx.ml domain (classical machine learning operators).

Maps are Python dicts, sequences of maps Python lists of dicts; see ``_common``."""
