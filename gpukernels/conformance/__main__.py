"""python -m gpukernels.conformance: run the official ONNX backend suite."""

import sys

from .report import main

sys.exit(main())
