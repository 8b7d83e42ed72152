"""Real exported models: gpukernels vs onnxruntime on PyTorch and scikit-learn exports.

    pip install -e '.[bench,test]'      # torch, transformers, onnxscript, scikit-learn, skl2onnx
    python benchmarks/bench_real_models.py [--filter TEXT] [--list] [--no-time] [--repeat N]
                                           [--cache DIR] [--reexport] [--strict] [--json FILE]
    python benchmarks/bench_real_models.py --parity [--no-quantized] [--filter TEXT] [--cache DIR] ...
    python benchmarks/bench_real_models.py --write-test-exports tests/data/real_exports

Every model is built here from a configuration (torch.nn code written in this file, or
a transformers config class instantiated directly) with seeded random weights; nothing
is downloaded (HF_HUB_OFFLINE=1).  BatchNormalization statistics come from a pass over
random data in training mode, so normalised activations are not degenerate.  Each model
is exported six ways:

    ts17   torch.onnx.export(..., dynamo=False, opset_version=17)   (TorchScript exporter)
    dy20   torch.onnx.export(..., dynamo=True,  opset_version=20)   (dynamo exporter)
    dy23   torch.onnx.export(..., dynamo=True,  opset_version=23)

each with static shapes and with dynamic axes (batch, and sequence length or image
size where the model allows it).  A dynamic export is fed sizes other than the ones it
was exported with (where the exporter kept the axis dynamic).  The scikit-learn tree
ensembles go through skl2onnx instead (TreeEnsembleClassifier/Regressor; see
export_sklearn for the two variants).

For each export: node count, the largest absolute difference between gpukernels' and
onnxruntime's outputs on the same random inputs (pass: every element within
1e-3 * |onnxruntime| + 1e-4 * the output's largest |onnxruntime|; integer outputs equal),
and the median time of one run of each, timed in alternating blocks (harness.py) with
onnxruntime on 2 intra-op threads and spin-waiting off.  Then the geometric mean of the
gpukernels / onnxruntime ratios, how many are within 2x and 3x, the worst five with
their top operators from gpukernels.profile, and the operators that take the most
gpukernels time over all exports.

Exports are cached (default ~/.cache/gpukernels-bench, or --cache DIR): a rerun only
times.  An export that fails is listed with its error, as is a model gpukernels cannot
run (an export neither runtime runs is listed as "both fail": an invalid export).  With
--strict the exit status is 1 when gpukernels fails an export onnxruntime runs, or a
check fails; otherwise 0.

--parity (implies --no-time) compares gpukernels on "cpu" with gpukernels on "cuda"
instead of onnxruntime, through gpukernels.parity.  Device "cuda" is the CPU simulation
of CuPy (tests/cupy_sim), activated at startup in this mode only: its folder goes first on
sys.path before gpukernels is imported, as tests/conftest.py does under
GPUKERNELS_SIMULATE_CUDA=1 (no GPU and no real CuPy are involved; the simulation runs
NumPy underneath, so this mode is slow).  Besides every export it runs quantized variants
made from the float exports with onnxruntime.quantization (QUANTIZE: static QDQ with
per-channel int8 weights and uint8 activations, calibrated on CALIBRATION_FEEDS draws of
make_feeds; static QOperator for Conv/MatMul; quantize_dynamic), cached next to the
exports as <exporter>-<axes>.<kind>.onnx.  Pass: see PARITY_RTOL; integer values equal;
for a quantized variant every node's values are compared too, and the integer outputs
of the quantization operators (QUANT_OPS) must be bit-identical.  A disagreement is
reported with the first diverging node (parity's all_nodes).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import json
import logging
import math
import os
import pathlib
import platform
import re
import sys
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights never come from a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import onnx  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

BENCH_VERSION = 1  # bump when a model definition changes: cached exports are then redone
# an element passes when |gpukernels - onnxruntime| <= RTOL * |onnxruntime| + ATOL * max |onnxruntime|
# over that output (the absolute part follows the output's scale: logits of 0.01 or boxes of 400)
ATOL, RTOL = 1e-4, 1e-3
VARIANTS = [(exp, axes) for exp in ("ts17", "dy20", "dy23") for axes in ("static", "dynamic")]


def blas_description() -> str:
    """NumPy's BLAS as threadpoolctl sees it: library, version, kernels, threads (SciPy
    loads a BLAS of its own: the one under numpy's folder is named, else the first)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS unknown (no threadpoolctl)"
    found = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not found:
        return "BLAS unknown"
    info = next((i for i in found if "numpy" in str(i.get("filepath", ""))), found[0])
    return (f"{info.get('internal_api')} {info.get('version')} "
            f"({info.get('architecture') or '?'} kernels, {info.get('num_threads')} threads)")


def forced_blas_kernel() -> str:
    """A warning when OPENBLAS_CORETYPE (or OPENBLAS_L2_SIZE) is set: OpenBLAS then runs
    the named kernels instead of its own choice for this CPU.  Some machines set it for
    old OpenBLAS builds that fail on their processor; on an AVX-512 CPU Haswell's kernels
    ran float32 products of convolution and transformer shapes 1.6-1.9x slower here than
    OpenBLAS's own choice (SkylakeX kernels), while onnxruntime (MLAS) picks its kernels
    itself -- the ratios would then measure the variable.  Unset both for the benchmark
    command alone, e.g.
    ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_real_models.py``."""
    forced = [f"{k}={os.environ[k]}" for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ]
    if not forced:
        return ""
    return (f"{' and '.join(forced)} set: OpenBLAS runs those kernels instead of its own choice for this CPU "
            "(NumPy's products may be slower than a user's); to time what a user gets, run with "
            "'env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE'")


# --------------------------------------------------------------------------- specs

@dataclass
class In:
    """One model input: export shape; dyn maps axis -> (dim name, size fed to dynamic exports)."""
    name: str
    shape: tuple
    dtype: str = "float32"
    dyn: dict = field(default_factory=dict)
    low: int = 0      # integer inputs: values drawn from [low, high)
    high: int = 2

    def make(self, rng, dynamic: bool, declared=None):
        shape = list(self.shape)
        if dynamic:
            for axis, (_, size) in self.dyn.items():
                # feed another size only where the exporter kept the axis symbolic
                if declared is None or (axis < len(declared) and not isinstance(declared[axis], int)):
                    shape[axis] = size
        if self.dtype.startswith("int"):
            return rng.integers(self.low, self.high, size=shape).astype(self.dtype)
        return rng.standard_normal(shape).astype(self.dtype)


@dataclass
class Spec:
    name: str
    family: str
    build: object          # () -> torch.nn.Module (torch) or () -> fitted estimator (sklearn)
    inputs: list
    outputs: list
    kind: str = "torch"    # or "sklearn"
    note: str = ""


def _seed(text: str) -> int:
    return zlib.crc32(text.encode())


# --------------------------------------------------------------------------- torch.nn models

def _torch_models():
    """The torch.nn architectures written here (CNNs, detection, segmentation, a ViT)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def cbr(cin, cout, k=3, s=1, groups=1, dilation=1, act=nn.ReLU):
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, dilation * (k // 2), dilation, groups, bias=False),
                             nn.BatchNorm2d(cout), act() if act else nn.Identity())

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin, width, stride=1, dilation=1):
            super().__init__()
            cout = width
            self.body = nn.Sequential(cbr(cin, cout, 3, stride, dilation=dilation),
                                      cbr(cout, cout, 3, 1, dilation=dilation, act=None))
            self.short = (cbr(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return F.relu(self.body(x) + self.short(x))

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, width, stride=1, dilation=1):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(cbr(cin, width, 1), cbr(width, width, 3, stride, dilation=dilation),
                                      cbr(width, cout, 1, act=None))
            self.short = (cbr(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return F.relu(self.body(x) + self.short(x))

    class ResNet(nn.Module):
        """ResNet-18/50 layout (BasicBlock [2,2,2,2] / Bottleneck [3,4,6,3]) at reduced width;
        dilate=True gives output stride 8 (DeepLab's backbone) and returns the features."""

        def __init__(self, block, layers, width=32, classes=100, dilate=False):
            super().__init__()
            self.stem = nn.Sequential(cbr(3, width, 7, 2), nn.MaxPool2d(3, 2, 1))
            cin, stages = width, []
            for i, n in enumerate(layers):
                stride = 1 if i == 0 or (dilate and i >= 2) else 2
                dil = (2 if i == 2 else 4) if dilate and i >= 2 else 1
                blocks = []
                for j in range(n):
                    blocks.append(block(cin, width * 2 ** i, stride if j == 0 else 1, dil))
                    cin = width * 2 ** i * block.expansion
                stages.append(nn.Sequential(*blocks))
            self.stages = nn.Sequential(*stages)
            self.out_channels = cin
            self.dilate = dilate
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            y = self.stages(self.stem(x))
            if self.dilate:
                return y
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand, k=3, act=nn.ReLU6, se=None):
            super().__init__()
            mid = cin * expand
            layers = [cbr(cin, mid, 1, act=act)] if expand != 1 else []
            layers.append(cbr(mid, mid, k, stride, groups=mid, act=act))
            if se is not None:
                layers.append(se(mid, max(8, cin // 4)))
            layers.append(cbr(mid, cout, 1, act=None))
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    class SqueezeExcite(nn.Module):
        def __init__(self, c, r, act=nn.SiLU, gate=nn.Sigmoid):
            super().__init__()
            self.fc1, self.fc2, self.act, self.gate = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1), act(), gate()

        def forward(self, x):
            s = F.adaptive_avg_pool2d(x, 1)
            return x * self.gate(self.fc2(self.act(self.fc1(s))))

    class MobileNetV2(nn.Module):
        """MobileNetV2 layout (t, c, n, s table of the paper) at width 0.5."""

        def __init__(self, classes=100, w=0.5):
            super().__init__()
            table = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                     (6, 160, 3, 2), (6, 320, 1, 1)]
            c0 = int(32 * w)
            layers, cin = [cbr(3, c0, 3, 2, act=nn.ReLU6)], c0
            for t, c, n, s in table:
                for i in range(n):
                    layers.append(InvertedResidual(cin, int(c * w), s if i == 0 else 1, t))
                    cin = int(c * w)
            layers.append(cbr(cin, 640, 1, act=nn.ReLU6))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(640, classes)

        def forward(self, x):
            return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))

    class MobileNetV3(nn.Module):
        """MobileNetV3-Small layout: hardswish, squeeze-excite with hardsigmoid."""

        def __init__(self, classes=100):
            super().__init__()
            hs, re = nn.Hardswish, nn.ReLU
            se = lambda c, r: SqueezeExcite(c, r, nn.ReLU, nn.Hardsigmoid)  # noqa: E731
            # (kernel, expand ratio, out, se, act, stride)
            table = [(3, 1, 16, True, re, 2), (3, 4.5, 24, False, re, 2), (3, 3.67, 24, False, re, 1),
                     (5, 4, 40, True, hs, 2), (5, 6, 40, True, hs, 1), (5, 6, 40, True, hs, 1),
                     (5, 3, 48, True, hs, 1), (5, 3, 48, True, hs, 1), (5, 6, 96, True, hs, 2),
                     (5, 6, 96, True, hs, 1), (5, 6, 96, True, hs, 1)]
            layers, cin = [cbr(3, 16, 3, 2, act=hs)], 16
            for k, e, c, use_se, act, s in table:
                mid = int(round(cin * e))
                blk = [cbr(cin, mid, 1, act=act)] if mid != cin else []
                blk.append(cbr(mid, mid, k, s, groups=mid, act=act))
                if use_se:
                    blk.append(se(mid, max(8, mid // 4)))
                blk.append(cbr(mid, c, 1, act=None))
                layers.append(_Res(nn.Sequential(*blk), s == 1 and cin == c))
                cin = c
            layers.append(cbr(cin, 576, 1, act=hs))
            self.features = nn.Sequential(*layers)
            self.head = nn.Sequential(nn.Linear(576, 256), nn.Hardswish(), nn.Linear(256, classes))

        def forward(self, x):
            return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))

    class _Res(nn.Module):
        def __init__(self, body, residual):
            super().__init__()
            self.body, self.residual = body, residual

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    class EfficientNetB0(nn.Module):
        """EfficientNet-B0 layout (MBConv, SiLU, squeeze-excite) at width 0.5."""

        def __init__(self, classes=100, w=0.5):
            super().__init__()
            table = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                     (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]
            c0 = int(32 * w)
            layers, cin = [cbr(3, c0, 3, 2, act=nn.SiLU)], c0
            for e, k, s, c, n in table:
                for i in range(n):
                    cout = int(c * w)
                    layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, e, k, nn.SiLU,
                                                   lambda m, r: SqueezeExcite(m, r)))
                    cin = cout
            layers.append(cbr(cin, 640, 1, act=nn.SiLU))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(640, classes)

        def forward(self, x):
            return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))

    class DeepLabASPP(nn.Module):
        """DeepLabV3: dilated ResNet-18-style backbone (output stride 8), ASPP with rates
        6/12/18 and image pooling, bilinear upsampling to the input size."""

        def __init__(self, classes=8):
            super().__init__()
            self.backbone = ResNet(Basic, [2, 2, 2, 2], 16, dilate=True)
            c, m = self.backbone.out_channels, 64
            self.branches = nn.ModuleList([cbr(c, m, 1)] + [cbr(c, m, 3, dilation=r) for r in (6, 12, 18)])
            self.pool = nn.Sequential(nn.Conv2d(c, m, 1, bias=False), nn.BatchNorm2d(m), nn.ReLU())
            self.project = cbr(5 * m, m, 1)
            self.head = nn.Sequential(cbr(m, m, 3), nn.Conv2d(m, classes, 1))

        def forward(self, x):
            f = self.backbone(x)
            ys = [b(f) for b in self.branches]
            p = self.pool(F.adaptive_avg_pool2d(f, 1))
            ys.append(F.interpolate(p, size=f.shape[-2:], mode="bilinear", align_corners=False))
            y = self.head(self.project(torch.cat(ys, 1)))
            return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)

    class UNet(nn.Module):
        def __init__(self, classes=4, widths=(16, 32, 64, 128)):
            super().__init__()
            def double(a, b):
                return nn.Sequential(cbr(a, b), cbr(b, b))
            self.downs = nn.ModuleList()
            cin = 3
            for w in widths:
                self.downs.append(double(cin, w))
                cin = w
            self.ups, self.convs = nn.ModuleList(), nn.ModuleList()
            for w in reversed(widths[:-1]):
                self.ups.append(nn.ConvTranspose2d(cin, w, 2, 2))
                self.convs.append(double(2 * w, w))
                cin = w
            self.out = nn.Conv2d(cin, classes, 1)

        def forward(self, x):
            skips = []
            for i, d in enumerate(self.downs):
                x = d(x if i == 0 else F.max_pool2d(x, 2))
                skips.append(x)
            for up, conv, skip in zip(self.ups, self.convs, reversed(skips[:-1])):
                x = conv(torch.cat([up(x), skip], 1))
            return self.out(x)

    class TinyYolo(nn.Module):
        """A YOLO-style detector: strided SiLU/BN backbone, top-down neck (nearest upsample +
        concat), heads at strides 8/16/32, grid/anchor box decoding and top-k selection."""

        def __init__(self, classes=8, anchors=3, k=50):
            super().__init__()
            self.na, self.nc, self.k = anchors, classes, k
            a = nn.SiLU
            self.s8 = nn.Sequential(cbr(3, 16, 3, 2, act=a), cbr(16, 32, 3, 2, act=a), cbr(32, 32, 3, act=a),
                                    cbr(32, 64, 3, 2, act=a), cbr(64, 64, 3, act=a))
            self.s16 = nn.Sequential(cbr(64, 128, 3, 2, act=a), cbr(128, 128, 3, act=a))
            self.s32 = nn.Sequential(cbr(128, 256, 3, 2, act=a), cbr(256, 128, 1, act=a))
            self.lat16 = cbr(256, 128, 3, act=a)
            self.lat8 = cbr(192, 64, 3, act=a)
            no = anchors * (5 + classes)
            self.heads = nn.ModuleList([nn.Conv2d(c, no, 1) for c in (64, 128, 128)])
            anchor = torch.tensor([[[10, 13], [16, 30], [33, 23]], [[30, 61], [62, 45], [59, 119]],
                                   [[116, 90], [156, 198], [373, 326]]], dtype=torch.float32)
            self.register_buffer("anchor", anchor)

        def forward(self, x):
            p8 = self.s8(x)
            p16 = self.s16(p8)
            p32 = self.s32(p16)
            n16 = self.lat16(torch.cat([F.interpolate(p32, scale_factor=2.0, mode="nearest"), p16], 1))
            n8 = self.lat8(torch.cat([F.interpolate(n16, scale_factor=2.0, mode="nearest"), p8], 1))
            outs = []
            for i, (f, stride) in enumerate(zip((n8, n16, p32), (8, 16, 32))):
                y = self.heads[i](f)
                b, _, h, w = y.shape
                y = y.view(b, self.na, 5 + self.nc, h, w).permute(0, 1, 3, 4, 2).sigmoid()
                gy, gx = torch.meshgrid(torch.arange(h, dtype=torch.float32),
                                        torch.arange(w, dtype=torch.float32), indexing="ij")
                grid = torch.stack([gx, gy], -1).view(1, 1, h, w, 2)
                xy = (y[..., :2] * 2 - 0.5 + grid) * stride
                wh = (y[..., 2:4] * 2) ** 2 * self.anchor[i].view(1, self.na, 1, 1, 2)
                score = y[..., 4:5] * y[..., 5:]
                outs.append(torch.cat([xy - wh / 2, xy + wh / 2, score], -1).reshape(b, -1, 4 + self.nc))
            det = torch.cat(outs, 1)
            best, cls = det[..., 4:].max(-1)
            top, idx = best.topk(self.k, dim=1)
            boxes = torch.gather(det[..., :4], 1, idx.unsqueeze(-1).expand(-1, -1, 4))
            return boxes, top, torch.gather(cls, 1, idx)

    class PatchViT(nn.Module):
        """A ViT written directly: Conv patch embedding, class token, learned positions,
        pre-LayerNorm blocks with explicit MatMul/Softmax attention and a GELU MLP."""

        def __init__(self, image=64, patch=8, dim=192, depth=4, heads=3, classes=100):
            super().__init__()
            self.embed = nn.Conv2d(3, dim, patch, patch)
            n = (image // patch) ** 2
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
            self.blocks = nn.ModuleList([_Block(dim, heads) for _ in range(depth)])
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, classes)

        def forward(self, x):
            t = self.embed(x).flatten(2).transpose(1, 2)
            t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos
            for blk in self.blocks:
                t = blk(t)
            return self.head(self.norm(t[:, 0]))

    class _Block(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.h = heads
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) * (d // self.h) ** -0.5, -1)
            x = x + self.proj((a @ v).transpose(1, 2).reshape(b, n, d))
            return x + self.mlp(self.ln2(x))

    class TinyCNN(nn.Module):
        """For the CI exports: pre-activation blocks, so BatchNormalization nodes survive export
        (a BatchNorm after a Relu or an Add cannot be folded into a Conv)."""

        def __init__(self, classes=10):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(8)
            self.c2 = nn.Conv2d(8, 16, 3, 2, 1)
            self.bn2 = nn.BatchNorm2d(16)
            self.c3 = nn.Conv2d(16, 16, 3, padding=1)
            self.bn3 = nn.BatchNorm2d(16)
            self.fc = nn.Linear(16, classes)

        def forward(self, x):
            y = self.bn1(F.relu(self.c1(x)))
            y = self.bn2(F.relu(self.c2(y)))
            y = self.bn3(y + self.c3(y))
            return self.fc(F.adaptive_avg_pool2d(F.relu(y), 1).flatten(1))

    return dict(resnet18=lambda: ResNet(Basic, [2, 2, 2, 2], 32),
                resnet50=lambda: ResNet(Bottleneck, [3, 4, 6, 3], 16),
                mobilenet_v2=MobileNetV2, mobilenet_v3=MobileNetV3, efficientnet_b0=EfficientNetB0,
                deeplab_aspp=DeepLabASPP, unet=UNet, tiny_yolo=TinyYolo, vit_patch=PatchViT,
                tiny_cnn=TinyCNN)


# --------------------------------------------------------------------------- transformers models

def _outputs(out, names):
    """The named fields of a transformers ModelOutput, as a tuple of tensors."""
    return tuple(out[n] for n in names)


def _hf(model_fn, names, call):
    """A wrapper module: positional tensors in, a tuple of tensors out."""
    import torch

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model_fn()

        def forward(self, *args):
            return _outputs(call(self.m, *args), names)

    return Wrap


def _transformers_specs(tiny: bool = False) -> list:
    """Spec list for the transformers architectures (tiny=True: the CI sizes)."""
    import transformers as tf

    H = 64 if tiny else 256        # hidden size
    L = 2 if tiny else 4           # layers
    NH = 4                          # heads
    V = 256 if tiny else 2000      # vocabulary
    S = 16 if tiny else 64         # sequence length
    B = 2
    IMG = 32 if tiny else 64
    specs = []

    def text_ids(name="input_ids", s=S):
        return In(name, (B, s), "int64", {0: ("batch", 3), 1: ("sequence", s - 5)}, 0, V)

    def image(size=IMG, ch=3):
        return In("pixel_values", (B, ch, size, size), dyn={0: ("batch", 3)})

    def cfg(cls, attn=None, **kw):
        """A config; attn: an attention implementation other than transformers' default (sdpa
        where the architecture supports it)."""
        c = cls(**kw)
        if attn:
            c._attn_implementation = attn
        return c

    # --- text encoders / decoders
    bert = lambda: tf.BertModel(cfg(tf.BertConfig, vocab_size=V, hidden_size=H, num_hidden_layers=L,  # noqa: E731
                                    num_attention_heads=NH, intermediate_size=4 * H, max_position_embeddings=128))
    specs.append(Spec("bert", "text encoder", _hf(bert, ["last_hidden_state", "pooler_output"],
                                                  lambda m, i, a, t: m(input_ids=i, attention_mask=a,
                                                                       token_type_ids=t)),
                      [text_ids(),
                       In("attention_mask", (B, S), "int64", {0: ("batch", 3), 1: ("sequence", S - 5)}, 1, 2),
                       In("token_type_ids", (B, S), "int64", {0: ("batch", 3), 1: ("sequence", S - 5)}, 0, 2)],
                      ["last_hidden_state", "pooler_output"]))

    gpt2cfg = lambda: cfg(tf.GPT2Config, vocab_size=V, n_positions=128, n_embd=H, n_layer=L, n_head=NH,  # noqa: E731
                          bos_token_id=0, eos_token_id=0)
    # decoders get an attention mask (all ones) as real exports do: without one, transformers
    # looks for packed sequences in the position ids (torch.diff, which opset 17 lacks)
    mask = lambda: In("attention_mask", (B, S), "int64", {0: ("batch", 3), 1: ("sequence", S - 5)}, 1, 2)  # noqa: E731
    specs.append(Spec("gpt2", "text decoder", _hf(lambda: tf.GPT2LMHeadModel(gpt2cfg()), ["logits"],
                                                  lambda m, i, a: m(input_ids=i, attention_mask=a, use_cache=False)),
                      [text_ids(), mask()], ["logits"]))

    P = 8 if tiny else 32  # cached positions
    hd = H // NH

    def gpt2_kv_call(m, ids, *past):
        cache = tf.DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(L)])
        # the cache argument is `cache` in transformers 5.2x, `past_key_values` before
        key = "cache" if "cache" in inspect.signature(m.forward).parameters else "past_key_values"
        out = m(input_ids=ids, use_cache=True, **{key: cache})
        flat = [out.logits]
        for layer in out[key].layers:
            flat += [layer.keys, layer.values]
        return {"flat": flat}

    kv_inputs = [In("input_ids", (B, 1), "int64", {0: ("batch", 3)}, 0, V)]
    kv_outputs = ["logits"]
    for i in range(L):
        for kv in ("key", "value"):
            kv_inputs.append(In(f"past_{kv}_{i}", (B, NH, P, hd), dyn={0: ("batch", 3), 2: ("past", P + 7)}))
            kv_outputs.append(f"present_{kv}_{i}")

    def gpt2_kv_module():
        import torch

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = tf.GPT2LMHeadModel(gpt2cfg())

            def forward(self, ids, *past):
                return tuple(gpt2_kv_call(self.m, ids, *past)["flat"])

        return Wrap()

    specs.append(Spec("gpt2_kv", "text decoder", gpt2_kv_module, kv_inputs, kv_outputs,
                      note=f"one decode step with a KV cache of {P} positions"))

    def causal(name, cls, ccls, note="grouped-query attention, rotary", **extra):
        make = lambda: cls(cfg(ccls, vocab_size=V, hidden_size=H, intermediate_size=int(2.75 * H) // 8 * 8,  # noqa: E731
                               num_hidden_layers=L, num_attention_heads=NH * 2, num_key_value_heads=NH,
                               max_position_embeddings=256, **extra))
        specs.append(Spec(name, "text decoder", _hf(make, ["logits"], lambda m, i, a: m(input_ids=i, attention_mask=a,
                                                                                       use_cache=False)),
                          [text_ids(), mask()], ["logits"], note=note))

    causal("llama", tf.LlamaForCausalLM, tf.LlamaConfig)
    causal("qwen2", tf.Qwen2ForCausalLM, tf.Qwen2Config)
    causal("mistral", tf.MistralForCausalLM, tf.MistralConfig, sliding_window=S // 2,
           note=f"grouped-query attention, sliding window {S // 2}")

    # eager attention: with sdpa, torch 2.13's decomposition for the dynamo exporter fails
    # ("Cannot view a tensor with shape [2, 64, 4, 64] and strides ...")
    t5 = lambda: tf.T5EncoderModel(cfg(tf.T5Config, "eager", vocab_size=V, d_model=H, d_kv=H // NH,  # noqa: E731
                                       d_ff=2 * H, num_layers=L, num_heads=NH, feed_forward_proj="gated-gelu"))
    specs.append(Spec("t5_encoder", "text encoder", _hf(t5, ["last_hidden_state"], lambda m, i: m(input_ids=i)),
                      [text_ids()], ["last_hidden_state"], note="gated GELU, relative position bias, eager attention"))

    # --- audio
    mels, frames = (16, 32) if tiny else (40, 100)

    def whisper():
        from transformers.models.whisper.modeling_whisper import WhisperEncoder
        return WhisperEncoder(cfg(tf.WhisperConfig, num_mel_bins=mels, d_model=H, encoder_layers=L,
                                  encoder_attention_heads=NH, encoder_ffn_dim=4 * H, max_source_positions=frames))
    specs.append(Spec("whisper_encoder", "audio", _hf(whisper, ["last_hidden_state"],
                                                      lambda m, x: m(input_features=x)),
                      [In("input_features", (B, mels, 2 * frames), dyn={0: ("batch", 3)})], ["last_hidden_state"]))

    w2v = lambda: tf.Wav2Vec2Model(cfg(tf.Wav2Vec2Config, hidden_size=H, num_hidden_layers=L,  # noqa: E731
                                       num_attention_heads=NH, intermediate_size=4 * H, conv_dim=(64,) * 7,
                                       num_conv_pos_embeddings=32, num_conv_pos_embedding_groups=4))
    samples = 4000 if tiny else 16000
    specs.append(Spec("wav2vec2", "audio", _hf(w2v, ["last_hidden_state"], lambda m, x: m(input_values=x)),
                      [In("input_values", (B, samples), dyn={0: ("batch", 3), 1: ("samples", samples - 800)})],
                      ["last_hidden_state"]))

    # --- vision transformers
    vis = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=4 * H,
               image_size=IMG, patch_size=8)
    for name, cls, ccls, outs in (
            ("clip_vision", tf.CLIPVisionModel, tf.CLIPVisionConfig, ["last_hidden_state", "pooler_output"]),
            ("vit", tf.ViTModel, tf.ViTConfig, ["last_hidden_state", "pooler_output"]),
            ("deit", tf.DeiTModel, tf.DeiTConfig, ["last_hidden_state", "pooler_output"])):
        make = (lambda cls, ccls: lambda: cls(cfg(ccls, **vis)))(cls, ccls)
        specs.append(Spec(name, "vision transformer", _hf(make, outs, lambda m, x: m(pixel_values=x)),
                          [image()], outs))

    swin = lambda: tf.SwinModel(cfg(tf.SwinConfig, image_size=IMG, patch_size=4, embed_dim=32 if tiny else 48,  # noqa: E731
                                    depths=[2, 2, 2], num_heads=[2, 4, 8], window_size=4))
    specs.append(Spec("swin", "vision transformer", _hf(swin, ["last_hidden_state", "pooler_output"],
                                                        lambda m, x: m(pixel_values=x)),
                      [image()], ["last_hidden_state", "pooler_output"], note="shifted windows (Roll)"))

    mvit = lambda: tf.MobileViTModel(cfg(tf.MobileViTConfig, image_size=IMG, hidden_sizes=[64, 80, 96],  # noqa: E731
                                         neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320], expand_ratio=2.0))
    specs.append(Spec("mobilevit", "vision transformer", _hf(mvit, ["last_hidden_state", "pooler_output"],
                                                             lambda m, x: m(pixel_values=x)),
                      [image()], ["last_hidden_state", "pooler_output"], note="BatchNorm + unfold/fold"))

    conv = lambda: tf.ConvNextModel(cfg(tf.ConvNextConfig, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 3, 1]))  # noqa: E731
    specs.append(Spec("convnext", "cnn", _hf(conv, ["last_hidden_state", "pooler_output"],
                                             lambda m, x: m(pixel_values=x)),
                      [image()], ["last_hidden_state", "pooler_output"], note="depthwise 7x7, LayerNorm, GELU"))

    seg = lambda: tf.SegformerForSemanticSegmentation(cfg(  # noqa: E731
        tf.SegformerConfig, num_encoder_blocks=4, depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128],
        num_attention_heads=[1, 2, 4, 8], sr_ratios=[8, 4, 2, 1], decoder_hidden_size=64, num_labels=8))
    specs.append(Spec("segformer", "segmentation", _hf(seg, ["logits"], lambda m, x: m(pixel_values=x)),
                      [image()], ["logits"]))

    yolos = lambda: tf.YolosForObjectDetection(cfg(tf.YolosConfig, image_size=[IMG, IMG], patch_size=8,  # noqa: E731
                                                   hidden_size=H // 2, num_hidden_layers=L, num_attention_heads=NH,
                                                   intermediate_size=2 * H, num_detection_tokens=10, num_labels=8))
    specs.append(Spec("yolos", "detection", _hf(yolos, ["logits", "pred_boxes"], lambda m, x: m(pixel_values=x)),
                      [image()], ["logits", "pred_boxes"], note="ViT detector, detection tokens"))

    # --- state-space / RNN
    mamba = lambda: tf.MambaForCausalLM(cfg(tf.MambaConfig, vocab_size=V, hidden_size=128, state_size=16,  # noqa: E731
                                            num_hidden_layers=2, expand=2, conv_kernel=4, use_cache=False))
    specs.append(Spec("mamba", "state space", _hf(mamba, ["logits"], lambda m, i: m(input_ids=i, use_cache=False)),
                      [In("input_ids", (B, 32), "int64", {0: ("batch", 3)}, 0, V)], ["logits"],
                      note="slow (unrolled) selective scan"))
    rwkv = lambda: tf.RwkvForCausalLM(cfg(tf.RwkvConfig, vocab_size=V, hidden_size=128, num_hidden_layers=2,  # noqa: E731
                                          attention_hidden_size=128, intermediate_size=512, context_length=64))
    specs.append(Spec("rwkv", "state space", _hf(rwkv, ["logits"], lambda m, i: m(input_ids=i, use_cache=False)),
                      [In("input_ids", (B, 32), "int64", {0: ("batch", 3)}, 0, V)], ["logits"],
                      note="unrolled WKV recurrence"))
    return specs


def _sklearn_specs() -> list:
    def forest():
        from sklearn.ensemble import RandomForestClassifier
        x, y = _tabular(3)
        return RandomForestClassifier(n_estimators=50, max_depth=8, random_state=0).fit(x, y)

    def boosting():
        from sklearn.ensemble import GradientBoostingRegressor
        x, y = _tabular(0)
        return GradientBoostingRegressor(n_estimators=100, max_depth=4, random_state=0).fit(x, y)

    x_in = [In("X", (64, 20), dyn={0: ("batch", 100)})]
    return [Spec("random_forest", "scikit-learn", forest, x_in, ["label", "probabilities"], kind="sklearn",
                 note="TreeEnsembleClassifier, 50 trees"),
            Spec("gradient_boosting", "scikit-learn", boosting, x_in, ["variable"], kind="sklearn",
                 note="TreeEnsembleRegressor, 100 trees")]


def _tabular(classes):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 20)).astype(np.float32)
    score = x[:, 0] * 2 + np.sin(x[:, 1] * 3) + x[:, 2] * x[:, 3]
    if classes:
        return x, np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))
    return x, score.astype(np.float32)


def all_specs() -> list:
    tm = {}
    try:
        tm = _torch_models()
    except ImportError as exc:
        print(f"skipping the torch.nn models: {exc}", file=sys.stderr)
    img = lambda s=96: [In("image", (2, 3, s, s), dyn={0: ("batch", 3)})]  # noqa: E731
    seg = lambda s=96: [In("image", (2, 3, s, s), dyn={0: ("batch", 3), 2: ("height", s - 32),  # noqa: E731
                                                        3: ("width", s + 32)})]
    specs = []
    if tm:
        specs += [Spec("resnet18", "cnn", tm["resnet18"], img(), ["logits"], note="width 32"),
                  Spec("resnet50", "cnn", tm["resnet50"], img(), ["logits"], note="bottlenecks, width 16"),
                  Spec("mobilenet_v2", "cnn", tm["mobilenet_v2"], img(), ["logits"], note="depthwise, ReLU6"),
                  Spec("mobilenet_v3", "cnn", tm["mobilenet_v3"], img(), ["logits"],
                       note="hardswish, SE with hardsigmoid"),
                  Spec("efficientnet_b0", "cnn", tm["efficientnet_b0"], img(), ["logits"], note="SiLU, SE"),
                  Spec("tiny_yolo", "detection", tm["tiny_yolo"], img(128), ["boxes", "scores", "classes"],
                       note="box decoding + TopK, no NMS"),
                  Spec("deeplab_aspp", "segmentation", tm["deeplab_aspp"], seg(), ["logits"],
                       note="dilated convs, ASPP, bilinear"),
                  Spec("unet", "segmentation", tm["unet"], seg(), ["logits"], note="ConvTranspose, skips"),
                  Spec("vit_patch", "vision transformer", tm["vit_patch"], img(64), ["logits"],
                       note="torch.nn ViT, explicit attention")]
    try:
        specs += _transformers_specs()
    except ImportError as exc:
        print(f"skipping the transformers models: {exc}", file=sys.stderr)
    try:
        import skl2onnx  # noqa: F401
        import sklearn.ensemble  # noqa: F401
        specs += _sklearn_specs()
    except ImportError as exc:
        print(f"skipping the scikit-learn models: {exc}", file=sys.stderr)
    return specs


# --------------------------------------------------------------------------- building and exporting

def calibrate_batchnorm(module, spec: Spec, steps: int = 4):
    """Running statistics from `steps` batches of random data (cumulative average), so the
    exported normalisation is neither the identity nor degenerate."""
    import torch

    bns = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return 0
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
        with torch.no_grad():  # and non-trivial affine parameters
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.2, 0.2)
    module.train()
    rng = np.random.default_rng(1)
    with torch.no_grad():
        for _ in range(steps):
            module(*[torch.from_numpy(i.make(rng, False)) for i in spec.inputs])
    module.eval()
    return len(bns)


def build_torch(spec: Spec):
    import torch

    torch.manual_seed(_seed(spec.name))
    module = spec.build()
    module.eval()
    calibrate_batchnorm(module, spec)
    return module


def _example_args(spec: Spec):
    import torch

    rng = np.random.default_rng(_seed(spec.name) + 7)
    return tuple(torch.from_numpy(i.make(rng, False)) for i in spec.inputs)


@contextlib.contextmanager
def _quiet(log: io.StringIO):
    """Exporters print progress and warnings; keep them for the failure report instead."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        warnings.simplefilter("ignore")
        yield


def _dynamic_shapes(module, per_input: list) -> dict:
    """torch.export's dynamic_shapes for forward's signature: {parameter: spec}, where a
    *args parameter takes the tuple of the remaining inputs' specs."""
    out, rest = {}, list(per_input)
    for name, param in inspect.signature(module.forward).parameters.items():
        if param.kind == param.VAR_POSITIONAL:
            out[name], rest = tuple(rest), []
        elif rest and param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            out[name] = rest.pop(0)
    return out


def export_torch(spec: Spec, module, args, variant: tuple, path: pathlib.Path, captured: dict):
    """Export one variant to path.  captured caches torch.export programs so opsets 20 and 23
    of the dynamo exporter share one capture."""
    import torch

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. 'torchvision is not installed'
    exporter, axes = variant
    dynamic = axes == "dynamic"
    names_in = [i.name for i in spec.inputs]
    if exporter == "ts17":
        dyn = None
        if dynamic:
            dyn = {i.name: {a: n for a, (n, _) in i.dyn.items()} for i in spec.inputs if i.dyn}
            dyn.update({o: {0: "batch"} for o in spec.outputs})
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, input_names=names_in,
                          output_names=spec.outputs, dynamic_axes=dyn)
        return
    opset = int(exporter[2:])
    shapes = None
    if dynamic:
        shapes = _dynamic_shapes(module, [{a: torch.export.Dim.AUTO for a in i.dyn} or None for i in spec.inputs])
    if axes not in captured:
        try:
            captured[axes] = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        except Exception as exc:  # let torch.onnx.export try its other capture strategies
            captured[axes] = exc
    program = captured[axes]
    target = module if isinstance(program, Exception) else program
    onnx_program = torch.onnx.export(target, args, dynamo=True, opset_version=opset, input_names=names_in,
                                     output_names=spec.outputs, dynamic_shapes=shapes if target is module else None,
                                     verbose=False)
    onnx_program.save(str(path), external_data=False)


def export_sklearn(spec: Spec, estimator, variant: tuple, path: pathlib.Path):
    """skl2onnx at opset 17.  skl2onnx 1.20 lists the default domain twice in opset_import
    (same version; onnx.checker, onnxruntime and gpukernels accept it): "skl17" is its
    output as is, "skl17u" the same model with the duplicate entry removed."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    exporter, axes = variant
    x = spec.inputs[0]
    shape = [None if axes == "dynamic" else x.shape[0], x.shape[1]]
    options = {id(estimator): {"zipmap": False}} if hasattr(estimator, "predict_proba") else None
    model = to_onnx(estimator, initial_types=[(x.name, FloatTensorType(shape))], options=options, target_opset=17)
    if exporter == "skl17u":
        seen, unique = set(), []
        for o in model.opset_import:
            if (o.domain, o.version) not in seen:
                seen.add((o.domain, o.version))
                unique.append(onnx.helper.make_opsetid(o.domain, o.version))
        del model.opset_import[:]
        model.opset_import.extend(unique)
    onnx.save(model, str(path))


SKLEARN_VARIANTS = [("skl17", "static"), ("skl17", "dynamic"), ("skl17u", "static"), ("skl17u", "dynamic")]


def variants_for(spec: Spec) -> list:
    return SKLEARN_VARIANTS if spec.kind == "sklearn" else VARIANTS


def cache_root(base: pathlib.Path) -> pathlib.Path:
    import importlib.metadata as md

    def ver(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "none"

    tag = f"v{BENCH_VERSION}-torch{ver('torch')}-tf{ver('transformers')}-skl2onnx{ver('skl2onnx')}"
    return base / tag.replace("+", "_")


def ensure_exports(spec: Spec, root: pathlib.Path, reexport: bool, progress) -> dict:
    """{variant: (path or None, error or None, seconds)}: exports made or read from cache."""
    folder = root / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    todo, result = [], {}
    for v in variants_for(spec):
        path, err = folder / f"{v[0]}-{v[1]}.onnx", folder / f"{v[0]}-{v[1]}.error.txt"
        if reexport:
            path.unlink(missing_ok=True)
            err.unlink(missing_ok=True)
        if path.exists():
            result[v] = (path, None, 0.0)
        elif err.exists():
            result[v] = (None, err.read_text().splitlines()[0], 0.0)
        else:
            todo.append(v)
    if not todo:
        return result
    try:
        obj = build_torch(spec) if spec.kind == "torch" else spec.build()
        args = _example_args(spec) if spec.kind == "torch" else None
    except Exception as exc:
        for v in todo:
            result[v] = (None, f"building the model failed: {type(exc).__name__}: {exc}", 0.0)
        return result
    captured = {}
    for v in todo:
        path, err = folder / f"{v[0]}-{v[1]}.onnx", folder / f"{v[0]}-{v[1]}.error.txt"
        progress(f"exporting {spec.name} {v[0]} {v[1]}")
        log = io.StringIO()
        t0 = time.perf_counter()
        try:
            with _quiet(log):
                if spec.kind == "torch":
                    export_torch(spec, obj, args, v, path, captured)
                else:
                    export_sklearn(spec, obj, v, path)
            onnx.load(str(path))  # a file that loads, or the export failed
            result[v] = (path, None, time.perf_counter() - t0)
            progress(f"exported {spec.name} {v[0]} {v[1]} in {result[v][2]:.1f} s")
        except Exception as exc:
            path.unlink(missing_ok=True)
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()  # no terminal colours
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            if "## Exception summary" in lines[:-1]:  # torch.onnx: the cause follows this heading
                lines = lines[lines.index("## Exception summary") + 1:]
            msg = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]
            if "The following call raised this error:" in lines[:-2]:  # and where, in the model's code
                i = lines.index("The following call raised this error:")
                msg += f" [{lines[i + 1].split('/')[-1]}: {lines[i + 2]}]"
            err.write_text(msg + "\n\n" + traceback.format_exc() + "\n--- exporter output ---\n" + log.getvalue())
            result[v] = (None, msg, time.perf_counter() - t0)
    return result


# --------------------------------------------------------------------------- checking and timing

def declared_dims(model: onnx.ModelProto) -> dict:
    out = {}
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        out[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                        for d in vi.type.tensor_type.shape.dim]
    return out


def make_feeds(spec: Spec, model: onnx.ModelProto, dynamic: bool, seed: int | None = None) -> dict:
    """The inputs fed to an export (seed: another draw, e.g. for calibration)."""
    dims = declared_dims(model)
    rng = np.random.default_rng(_seed(spec.name) + (1 if dynamic else 0) if seed is None else seed)
    feeds = {}
    for i in spec.inputs:
        if i.name in dims:
            feeds[i.name] = i.make(rng, dynamic, dims[i.name])
    return feeds


def ort_session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def compare(gk_out: list, ort_out: list) -> tuple:
    """(max abs difference, within tolerance)."""
    worst, ok = 0.0, True
    if len(gk_out) != len(ort_out):
        return float("inf"), False
    for a, b in zip(gk_out, ort_out):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return float("inf"), False
        if a.size == 0:
            continue
        if a.dtype.kind in "fc" or b.dtype.kind in "fc":
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            both_nan = np.isnan(a64) & np.isnan(b64)
            with np.errstate(invalid="ignore"):  # inf - inf
                d = np.where(both_nan | (a64 == b64), 0.0, np.abs(a64 - b64))
            d = np.where(np.isnan(d), np.inf, d)
            worst = max(worst, float(d.max()))
            ref = np.abs(np.nan_to_num(b64, posinf=0.0, neginf=0.0))
            scale = float(ref.max()) if ref.size else 0.0
            ok &= bool(np.all(d <= RTOL * ref + ATOL * max(scale, 1e-6)))
        else:
            diff = a.astype(np.int64) != b.astype(np.int64)
            if diff.any():
                ok = False
                worst = max(worst, float(np.abs(a.astype(np.int64) - b.astype(np.int64)).max()))
    return worst, ok


def time_alternating(fns: dict, repeat: int, min_time: float, blocks: int = 3, settle: float = 0.15) -> dict:
    """{name: (median, fastest)} seconds per call, timed as harness._time_alternating times:
    after a warm-up, blocks of each runtime's calls in turn with a pause between blocks.
    The fastest call is kept too: on a shared machine a busy core slows OpenBLAS's
    spin-waiting threads far more than onnxruntime's (spinning off), and the best run
    shows what each side does with both cores."""
    samples = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    per_block = max(1, -(-repeat // blocks))
    for _ in range(blocks):
        for k, fn in fns.items():
            time.sleep(settle)
            start, n = time.perf_counter(), 0
            while n < per_block or (time.perf_counter() - start < min_time / blocks and n < 400):
                t0 = time.perf_counter()
                fn()
                samples[k].append(time.perf_counter() - t0)
                n += 1
    return {k: (float(np.median(v)), min(v)) for k, v in samples.items()}


def run_export(spec: Spec, variant, path, args, progress) -> dict:
    """Check and time one export; returns the row."""
    from gpukernels.profiling import profile
    from gpukernels.runtime import Session

    row = {"model": spec.name, "family": spec.family, "exporter": variant[0], "axes": variant[1]}
    model = onnx.load(str(path), load_external_data=False)
    row["nodes"] = len(model.graph.node)
    row["opsets"] = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    feeds = make_feeds(spec, model, variant[1] == "dynamic")
    row["feed_shapes"] = {k: list(v.shape) for k, v in feeds.items()}
    progress(f"running {spec.name} {variant[0]} {variant[1]}")
    try:
        ort = ort_session(path)
        ort_out = ort.run(None, feeds)
    except Exception as exc:
        row["ort_error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        ort = ort_out = None
    try:
        sess = Session(str(path), device="cpu")
        gk_out = sess.run(None, feeds)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return row
    if ort_out is not None:
        row["max_abs_diff"], row["ok"] = compare(gk_out, ort_out)
    if not args.no_time:
        fns = {"gpukernels": lambda: sess.run(None, feeds)}
        if ort is not None:
            fns["onnxruntime"] = lambda: ort.run(None, feeds)
        row["load"] = os.getloadavg()[0]
        times = time_alternating(fns, args.repeat, args.min_time)
        row["gk_ms"], row["gk_best_ms"] = (t * 1e3 for t in times["gpukernels"])
        if "onnxruntime" in times:
            row["ort_ms"], row["ort_best_ms"] = (t * 1e3 for t in times["onnxruntime"])
            row["ratio"] = row["gk_ms"] / row["ort_ms"]
            row["best_ratio"] = row["gk_best_ms"] / row["ort_best_ms"]
        if args.profile_repeat:
            rep = profile(str(path), device="cpu", repeat=args.profile_repeat, inputs=feeds)
            row["profile_ms"] = {op: t / rep.repeat * 1e3 for op, t in rep.operators.items()}
    return row


# --------------------------------------------------------------------------- parity: cpu vs cuda

# cpu vs cuda: an element passes when |cuda - cpu| <= PARITY_RTOL * |cpu| + PARITY_ATOL * max |cpu|
# over that value; integer values equal.  Both devices run the same algorithms in float32, but
# not always in the same order (a host specialisation such as the Conv host path against the
# shared im2col reference, other summation orders): the same freedom as between gpukernels and
# onnxruntime, so the same tolerance.  A real divergence (one quantization step, 1/255 of the
# range, or a wrong element) is at least 40 times larger.
PARITY_RTOL, PARITY_ATOL = RTOL, ATOL
# operators whose integer outputs must agree bit for bit
QUANT_OPS = {"QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv",
             "QLinearMatMul"}
QUANT_KINDS = {
    "qdq": "onnxruntime quantize_static, QDQ: per-channel int8 weights, uint8 activations (MinMax calibration)",
    "qop": "onnxruntime quantize_static, QOperator, Conv and MatMul only (QLinearConv, QLinearMatMul)",
    "qdyn": "onnxruntime quantize_dynamic: int8 weights, DynamicQuantizeLinear + MatMulInteger/ConvInteger",
}
_TS = ("ts17", "static")
QUANTIZE = ([(m, _TS, "qdq") for m in ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3", "efficientnet_b0",
                                      "convnext", "tiny_yolo", "deeplab_aspp", "unet", "vit_patch", "vit", "bert")]
            + [(m, _TS, "qop") for m in ("resnet18", "mobilenet_v2", "vit_patch")]
            + [(m, _TS, "qdyn") for m in ("bert", "gpt2", "gpt2_kv", "vit", "deit", "clip_vision", "whisper_encoder",
                                          "t5_encoder", "llama", "wav2vec2", "mobilenet_v2")]
            + [("resnet18", ("dy20", "static"), "qdq"), ("bert", ("dy20", "static"), "qdyn"),
               ("bert", ("ts17", "dynamic"), "qdyn")])
CALIBRATION_FEEDS = 4


def activate_cupy_simulation() -> None:
    """Device 'cuda' becomes the CPU simulation of CuPy (tests/cupy_sim): its folder goes first
    on sys.path before gpukernels is imported (and probes CUDA), as tests/conftest.py does."""
    if "gpukernels" in sys.modules or "cupy" in sys.modules:
        raise RuntimeError("the CuPy simulation must be activated before gpukernels or cupy is imported")
    sys.path.insert(0, str(HERE.parent / "tests" / "cupy_sim"))
    import cupy

    from gpukernels.xp import cuda_status

    if not getattr(cupy, "__gpukernels_simulated__", False) or not cuda_status().available:
        raise RuntimeError(f"the CuPy simulation did not load: {cuda_status().reason}")


def quantize_export(spec: Spec, src: pathlib.Path, axes: str, kind: str, dst: pathlib.Path) -> None:
    """Quantize the float export src into dst with onnxruntime's tools (QUANT_KINDS)."""
    from onnxruntime import quantization as oq

    if kind == "qdyn":
        oq.quantize_dynamic(str(src), str(dst), weight_type=oq.QuantType.QInt8)
        return
    model = onnx.load(str(src), load_external_data=False)
    calib = [make_feeds(spec, model, axes == "dynamic", seed=_seed(spec.name) + 1000 + k)
             for k in range(CALIBRATION_FEEDS)]

    class Reader(oq.CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            return next(self.it, None)

    fmt = oq.QuantFormat.QDQ if kind == "qdq" else oq.QuantFormat.QOperator
    ops = ["Conv", "MatMul"] if kind == "qop" else None
    oq.quantize_static(str(src), str(dst), Reader(), quant_format=fmt, per_channel=True,
                       activation_type=oq.QuantType.QUInt8, weight_type=oq.QuantType.QInt8,
                       calibrate_method=oq.CalibrationMethod.MinMax, op_types_to_quantize=ops)


def ensure_quantized(spec: Spec, exports: dict, reexport: bool, progress) -> dict:
    """{(label, axes): (path or None, error or None)} for spec's entries in QUANTIZE, made
    from the cached float exports and cached next to them (<exporter>-<axes>.<kind>.onnx)."""
    result = {}
    for name, src_variant, kind in QUANTIZE:
        if name != spec.name:
            continue
        label = (f"{src_variant[0]}+{kind}", src_variant[1])
        src = exports.get(src_variant, (None, "not exported"))[0]
        if src is None:
            result[label] = (None, f"no float export {src_variant[0]} {src_variant[1]} to quantize")
            continue
        dst = src.with_name(f"{src.stem}.{kind}.onnx")
        err = dst.with_name(f"{src.stem}.{kind}.error.txt")
        if reexport:
            dst.unlink(missing_ok=True)
            err.unlink(missing_ok=True)
        if dst.exists():
            result[label] = (dst, None)
        elif err.exists():
            result[label] = (None, err.read_text().splitlines()[0])
        else:
            progress(f"quantizing {spec.name} {label[0]} {label[1]}")
            log = io.StringIO()
            try:
                with _quiet(log):
                    quantize_export(spec, src, src_variant[1], kind, dst)
                onnx.load(str(dst))
                result[label] = (dst, None)
            except Exception as exc:
                dst.unlink(missing_ok=True)
                msg = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                err.write_text(msg + "\n\n" + traceback.format_exc() + "\n--- output ---\n" + log.getvalue())
                result[label] = (None, msg)
    return result


def _is_integer(v) -> bool:
    try:
        return np.dtype(v.dtype).kind in "iub"
    except TypeError:  # 'sequence'
        return False


def _error_text(exc) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _quant_values(model: onnx.ModelProto, side) -> tuple:
    """(integer outputs of QUANT_OPS nodes, those that differ while the node's inputs are
    bit-identical on both devices: a kernel disagreement, those that differ because an input
    already did: a float difference upstream, rounded to another integer)."""
    diffs = {v.name: v for v in side.values}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    values = [v for v in side.values if v.op_type in QUANT_OPS and _is_integer(v)]
    own, inherited = [], []
    for v in values:
        if v.max_abs == 0:
            continue
        same_inputs = all(diffs[i].max_abs == 0 for i in producer[v.name].input if i in diffs)
        (own if same_inputs else inherited).append(
            f"{v.name} ({v.op_type}): max diff {v.max_abs:g}, {v.outside:.2%} of elements")
    return values, own, inherited


def parity_export(spec: Spec, label: tuple, path: pathlib.Path, progress) -> dict:
    """Run one export on cpu and on cuda (the CuPy simulation) with gpukernels.parity and
    compare the outputs.  When they disagree, compare every node's values (all_nodes: no
    graph optimisation, no constant folding) and name the first diverging node.

    A quantized export must agree end to end like a float one (its graph runs with the
    default optimisations: products of dequantized values summed exactly, pass
    'dequantized'), and is also compared node by node, twice, on the graph as written.
    With the default paths its QUANT_OPS outputs must be bit-identical wherever the node's
    inputs are: a float input that differs in the last place (a Conv or MatMul summing in
    another order, within its stated agreement) may round to the neighbouring integer, and
    that step then flows on; such values are counted apart.  With paths='reference' on both
    devices (one algorithm, the same operation order) every quantization output must be
    bit-identical, and the float outputs within the tolerance."""
    from gpukernels.parity import compare
    from gpukernels.runtime import Session

    exporter, axes = label
    quant = exporter.split("+")[1] if "+" in exporter else ""
    row = {"model": spec.name, "family": spec.family, "exporter": exporter, "axes": axes, "quant": quant}
    model = onnx.load(str(path), load_external_data=False)
    row["nodes"] = len(model.graph.node)
    feeds = make_feeds(spec, model, axes == "dynamic")
    kw = dict(devices=("cpu", "cuda"), inputs=feeds, rtol=PARITY_RTOL, atol=PARITY_ATOL, atol_relative=True,
              exact_integers=True)
    progress(f"parity {spec.name} {exporter} {axes}")
    try:
        report = compare(str(path), **kw)
    except Exception as exc:
        row["error"] = _error_text(exc)
        try:
            Session(str(path), device="cpu").run(None, feeds)
        except Exception:
            row["cpu_fails"] = True  # not a disagreement: the export does not run (see the ort comparison)
        return row
    values = report.sides[0].values
    floats = [v for v in values if not _is_integer(v)]
    row["max_abs_diff"] = max((v.max_abs for v in floats), default=0.0)
    row["max_rel_diff"] = max((v.max_rel for v in floats), default=0.0)
    row["outputs_ok"] = row["ok"] = report.passed
    if not quant and report.passed:
        return row
    progress(f"parity {spec.name} {exporter} {axes}: all nodes")
    nodes = compare(str(path), all_nodes=True, **kw)
    side = nodes.sides[0]
    row["values"] = len(side.values)
    row["values_failed"] = sum(not v.passed for v in side.values)
    if side.first_divergence is not None:
        row["first_divergence"] = f"{side.first_divergence.node} ({side.first_divergence.op_type})"
    if not quant:
        return row
    qv, row["quant_mismatch"], row["quant_inherited"] = _quant_values(model, side)
    row["quant_values"] = len(qv)
    row["quant_ops"] = sorted({v.op_type for v in qv})
    progress(f"parity {spec.name} {exporter} {axes}: all nodes, reference paths")
    ref = compare(str(path), all_nodes=True, paths=("reference",), **kw)
    rside = ref.sides[0]
    rq, own, inherited = _quant_values(model, rside)
    row["ref_quant_mismatch"] = own + inherited
    row["ref_bitwise"] = f"{sum(v.max_abs == 0 for v in rside.values)}/{len(rside.values)}"
    row["ref_max_abs_diff"] = max((v.max_abs for v in rside.values if not _is_integer(v)), default=0.0)
    row["ok"] = (row["outputs_ok"] and not row["quant_mismatch"] and not row["ref_quant_mismatch"]
                 and ref.passed)
    return row


def parity_label(r: dict) -> str:
    """ok / FAIL / ERROR (cuda fails, cpu runs) / both fail (an export cpu does not run either)."""
    if "error" in r:
        return "both fail" if r.get("cpu_fails") else "ERROR"
    return "ok" if r.get("ok") else "FAIL"


def _quant_cell(r: dict) -> str:
    """Quantization outputs: bit-identical / all, and how many differ after an input did."""
    if "quant_values" not in r:
        return ""
    n, own, inh = r["quant_values"], len(r["quant_mismatch"]), len(r["quant_inherited"])
    return f"{n - own - inh}/{n} ({', '.join(r['quant_ops'])}); {inh} after an input differed; {own} on equal inputs"


def print_parity_report(rows: list, errors: list, out=sys.stdout) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"\nTolerance: |cuda - cpu| <= {PARITY_RTOL:g} * |cpu| + {PARITY_ATOL:g} * max|cpu| per element of each value; "
      "integer values equal.  Quantized variants: every node compared; with the default paths the integer outputs "
      f"of {', '.join(sorted(QUANT_OPS))} must be bit-identical wherever the node's inputs are; with "
      "paths=reference on both devices they must all be bit-identical (see parity_export).\n")
    p("| model | exporter | axes | nodes | max abs diff | max rel diff | outputs within tolerance | "
      "quantization outputs bit-identical (default paths) | reference paths: bit-identical values | check | "
      "first diverging node |")
    p("|---|---|---|---:|---:|---:|---|---|---|---|---|")
    for r in rows:
        rel = f"{r['max_rel_diff']:.1e}" if "max_rel_diff" in r else ""
        within = "" if "outputs_ok" not in r else ("yes" if r["outputs_ok"] else "no")
        p(f"| {r['model']} | {r['exporter']} | {r['axes']} | {r.get('nodes', '')} | {_fmt_diff(r)} | {rel} | "
          f"{within} | {_quant_cell(r)} | {r.get('ref_bitwise', '')} | {parity_label(r)} | "
          f"{r.get('first_divergence', '')} |")
    for (model, exporter, axes), err in errors:
        p(f"| {model} | {exporter} | {axes} | | | | | | | not made | |")
    labels = [parity_label(r) for r in rows]
    for what, rs in (("float exports", [r for r in rows if not r["quant"]]),
                     ("quantized variants", [r for r in rows if r["quant"]])):
        lab = [parity_label(r) for r in rs]
        p(f"\n{what}: {len(rs)} run; agree: {lab.count('ok')}; outputs within tolerance (default paths): "
          f"{sum(1 for r in rs if r.get('outputs_ok'))}; FAIL: {lab.count('FAIL')}; ERROR (cuda only): "
          f"{lab.count('ERROR')}; invalid exports (cpu fails too): {lab.count('both fail')}")
    families = {}
    for r in rows:
        if "max_abs_diff" in r:
            key = (r["family"], bool(r["quant"]))
            families[key] = max(families.get(key, (0.0, 0.0, "")), (r["max_abs_diff"], r["max_rel_diff"],
                                                                       f"{r['model']} {r['exporter']} {r['axes']}"))
    p("\nlargest cpu/cuda differences of the outputs per family (max abs, max rel over the family; where):")
    for (fam, q), (a, rel, where) in sorted(families.items()):
        p(f"- {fam}{' (quantized)' if q else ''}: {a:.1e}, {rel:.1e} ({where})")
    bad = [r for r, lab in zip(rows, labels) if lab != "ok" or not r.get("outputs_ok", True)]
    if bad:
        p("\nproblems and notes:")
        for r in bad:
            parts = ([r["error"]] if "error" in r else
                     [f"outputs max abs diff {_fmt_diff(r)}", f"first diverging node {r.get('first_divergence')}"]
                     + [f"differs on equal inputs: {m}" for m in r.get("quant_mismatch", [])[:3]]
                     + [f"reference paths: {m}" for m in r.get("ref_quant_mismatch", [])[:3]])
            p(f"- {r['model']} {r['exporter']} {r['axes']} [{parity_label(r)}]: " + "; ".join(parts))
    if errors:
        p("\nnot made:")
        for (model, exporter, axes), err in errors:
            p(f"- {model} {exporter} {axes}: {err}")


# --------------------------------------------------------------------------- report

def _fmt_ms(v):
    return "" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.0f}")


def _fmt_diff(row):
    if "max_abs_diff" not in row:
        return ""
    d = row["max_abs_diff"]
    return "inf" if math.isinf(d) else f"{d:.1e}"


def check_label(r: dict) -> str:
    """ok / FAIL (out of tolerance) / ERROR (gpukernels fails, onnxruntime runs) / both fail
    (neither runtime runs the export: an invalid export) / ort failed (only gpukernels runs)."""
    if "error" in r:
        return "both fail" if "ort_error" in r else "ERROR"
    if "ort_error" in r:
        return "ort failed"
    return "ok" if r.get("ok") else "FAIL" if "ok" in r else ""


def gk_failed(r: dict) -> bool:
    """A failure of gpukernels': an error on an export onnxruntime runs, or a failed check."""
    return check_label(r) in ("ERROR", "FAIL")


def print_report(rows: list, export_errors: list, out=sys.stdout) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"\nTolerance: |gpukernels - onnxruntime| <= {RTOL:g} * |onnxruntime| + {ATOL:g} * max|onnxruntime| "
      "per element of each output (integer outputs equal).  Times: median ms per run; ratio = gpukernels / "
      "onnxruntime (lower is better); best = the same ratio of the fastest runs; load = the 1-minute load "
      "average when the export was timed.\n")
    p("| model | exporter | axes | nodes | max abs diff | check | gpukernels ms | onnxruntime ms | ratio | best "
      "| load |")
    p("|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        check = check_label(r)
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else ""
        best = f"{r['best_ratio']:.2f}" if "best_ratio" in r else ""
        load = f"{r['load']:.1f}" if "load" in r else ""
        p(f"| {r['model']} | {r['exporter']} | {r['axes']} | {r.get('nodes', '')} | {_fmt_diff(r)} | {check} | "
          f"{_fmt_ms(r.get('gk_ms'))} | {_fmt_ms(r.get('ort_ms'))} | {ratio} | {best} | {load} |")
    for (model, exporter, axes), err in export_errors:
        p(f"| {model} | {exporter} | {axes} | | | export failed | | | | | |")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    n_ok = sum(1 for r in rows if r.get("ok"))
    checked = sum(1 for r in rows if "ok" in r)
    labels = [check_label(r) for r in rows]
    p(f"\nexports run: {len(rows)}; within tolerance: {n_ok}/{checked}; gpukernels errors: {labels.count('ERROR')}; "
      f"invalid exports (neither runtime runs them): {labels.count('both fail')}; onnxruntime-only errors: "
      f"{labels.count('ort failed')}; export failures: {len(export_errors)}")
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        p(f"geometric mean ratio: {geo:.2f} over {len(ratios)} exports; within 2x: "
          f"{sum(x <= 2 for x in ratios)}; within 3x: {sum(x <= 3 for x in ratios)}")
        best = [r["best_ratio"] for r in rows if "best_ratio" in r]
        geo_best = math.exp(sum(math.log(x) for x in best) / len(best))
        p(f"fastest runs: geometric mean ratio {geo_best:.2f}; within 2x: {sum(x <= 2 for x in best)}; "
          f"within 3x: {sum(x <= 3 for x in best)}")
        worst = sorted((r for r in rows if "ratio" in r), key=lambda r: -r["ratio"])[:5]
        p("\nworst 5 (top operators by gpukernels time, ms per run):")
        for r in worst:
            top = ", ".join(f"{op} {ms:.2f}" for op, ms in list(r.get("profile_ms", {}).items())[:3])
            p(f"- {r['model']} {r['exporter']} {r['axes']}: {r['ratio']:.2f}x "
              f"({_fmt_ms(r['gk_ms'])} vs {_fmt_ms(r['ort_ms'])} ms); {top}")
        print_operator_totals(rows, out)
    bad = [r for r in rows if "error" in r or "ort_error" in r or ("ok" in r and not r["ok"])]
    if bad:
        p("\nproblems:")
        for r in bad:
            if "ok" in r:
                p(f"- {r['model']} {r['exporter']} {r['axes']}: max abs diff {_fmt_diff(r)} out of tolerance")
            for who, key in (("gpukernels", "error"), ("onnxruntime", "ort_error")):
                if key in r:
                    p(f"- {r['model']} {r['exporter']} {r['axes']}: {who}: {r[key]}")
    if export_errors:
        p("\nexport failures:")
        for (model, exporter, axes), err in export_errors:
            p(f"- {model} {exporter} {axes}: {err}")


def print_operator_totals(rows: list, out=sys.stdout, top: int = 15) -> None:
    """Which kernels dominate: each operator's share of gpukernels time summed over all
    profiled exports, its mean share per export and how often it is an export's top operator."""
    total, share, first = {}, {}, {}
    profiled = [r for r in rows if r.get("profile_ms")]
    for r in profiled:
        s = sum(r["profile_ms"].values()) or 1.0
        for op, ms in r["profile_ms"].items():
            total[op] = total.get(op, 0.0) + ms
            share[op] = share.get(op, 0.0) + ms / s
        op0 = next(iter(r["profile_ms"]))
        first[op0] = first.get(op0, 0) + 1
    if not profiled:
        return
    grand = sum(total.values()) or 1.0
    print(f"\noperators by gpukernels time over {len(profiled)} profiled exports "
          "(sum of per-run ms; mean share per export; times the export's top operator):", file=out)
    print("| operator | total ms | share of total | mean share | top in |", file=out)
    print("|---|---:|---:|---:|---:|", file=out)
    for op, ms in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {op} | {ms:.1f} | {ms / grand * 100:.1f}% | {share[op] / len(profiled) * 100:.1f}% | "
              f"{first.get(op, 0)} |", file=out)


# --------------------------------------------------------------------------- CI exports

TEST_EXPORTS = [
    # (file stem, model, exporter variant, description)
    ("cnn_bn_ts17", "tiny_cnn", ("ts17", "static"), "CNN with BatchNormalization nodes, TorchScript exporter"),
    ("bert_ts17_dynamic", "bert", ("ts17", "dynamic"), "BERT encoder, dynamic batch and sequence"),
    ("gpt2_kv_dy20", "gpt2_kv", ("dy20", "static"), "GPT-2 decode step with KV cache, dynamo exporter"),
    ("vit_dy23", "vit", ("dy23", "static"), "ViT (transformers), dynamo exporter at opset 23"),
    ("unet_dy20_dynamic", "unet_tiny", ("dy20", "dynamic"), "UNet, dynamic batch/height/width, dynamo"),
    ("llama_dy23", "llama", ("dy23", "static"), "LLaMA decoder (GQA, rotary), dynamo exporter at opset 23"),
]


def tiny_specs() -> dict:
    tm = _torch_models()

    specs = {s.name: s for s in _transformers_specs(tiny=True)}
    specs["tiny_cnn"] = Spec("tiny_cnn", "cnn", tm["tiny_cnn"], [In("image", (2, 3, 32, 32), dyn={0: ("batch", 3)})],
                             ["logits"])
    specs["unet_tiny"] = Spec("unet_tiny", "segmentation", lambda: tm["unet"](widths=(8, 16, 32)),
                              [In("image", (2, 3, 32, 32), dyn={0: ("batch", 3), 2: ("height", 48), 3: ("width", 16)})],
                              ["logits"])
    return specs


def write_test_exports(folder: pathlib.Path) -> None:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    specs = tiny_specs()
    for stem, name, variant, desc in TEST_EXPORTS:
        spec = specs[name]
        module = build_torch(spec)
        args = _example_args(spec)
        path = folder / f"{stem}.onnx"
        log = io.StringIO()
        with _quiet(log):
            export_torch(spec, module, args, variant, path, {})
        model = onnx.load(str(path))
        dims = declared_dims(model)
        meta = {"description": desc, "model": name, "exporter": variant[0], "axes": variant[1],
                "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
                "torch": torch.__version__, "nodes": len(model.graph.node),
                "inputs": [{"name": i.name, "dtype": i.dtype, "shape": list(i.shape), "declared": dims.get(i.name),
                            "dynamic_sizes": {str(a): s for a, (_, s) in i.dyn.items()} if variant[1] == "dynamic"
                            else {},
                            "values": (f"integers in [{i.low}, {i.high})" if i.dtype.startswith("int")
                                       else "standard normal"),
                            **({"low": i.low, "high": i.high} if i.dtype.startswith("int") else {})}
                           for i in spec.inputs if i.name in dims],
                "outputs": [o.name for o in model.graph.output]}
        (folder / f"{stem}.json").write_text(json.dumps(meta, indent=1) + "\n")
        feeds = make_feeds(spec, model, variant[1] == "dynamic")
        from gpukernels.runtime import Session
        diff, ok = compare(Session(str(path)).run(None, feeds), ort_session(path).run(None, feeds))
        print(f"{path}: {path.stat().st_size / 1024:.0f} KiB, {meta['nodes']} nodes, "
              f"gpukernels vs onnxruntime max abs diff {diff:.1e} ({'ok' if ok else 'FAIL'})")


# --------------------------------------------------------------------------- main

def parity_main(args, specs: list, root: pathlib.Path, progress) -> int:
    """--parity: every selected export and quantized variant on cpu and cuda (simulated)."""
    import onnxruntime

    print(f"# real-model parity, cpu vs cuda (CuPy simulated on the CPU, tests/cupy_sim): {platform.node()}, "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}; onnxruntime {onnxruntime.__version__} (quantization tools); "
          f"exports in {root}")
    rows, errors = [], []
    start = time.perf_counter()
    for spec in specs:
        float_wanted = [v for v in variants_for(spec) if args.filter in f"{spec.name} {v[0]} {v[1]}"]
        quant_wanted = [] if args.no_quantized else [
            (f"{src[0]}+{kind}", src[1]) for name, src, kind in QUANTIZE
            if name == spec.name and args.filter in f"{spec.name} {src[0]}+{kind} {src[1]}"]
        if not float_wanted and not quant_wanted:
            continue
        exports = ensure_exports(spec, root, args.reexport, progress)
        made = {v: exports[v][:2] for v in float_wanted}
        if quant_wanted:
            made.update({k: v for k, v in ensure_quantized(spec, exports, args.reexport, progress).items()
                         if k in quant_wanted})
        for label, (path, err) in made.items():
            if path is None:
                errors.append(((spec.name, *label), err))
                continue
            try:
                row = parity_export(spec, label, path, progress)
            except Exception as exc:  # a failure of the benchmark itself on one export
                row = {"model": spec.name, "family": spec.family, "exporter": label[0], "axes": label[1],
                       "quant": "", "error": f"benchmark: {type(exc).__name__}: {exc}"}
            rows.append(row)
            status = parity_label(row) + (f" ({row['error']})" if "error" in row else "")
            progress(f"{spec.name} {label[0]} {label[1]}: {status[:160]} diff={_fmt_diff(row)}"
                     + (f" first divergence {row['first_divergence']}" if "first_divergence" in row else ""))
    print_parity_report(rows, errors)
    print(f"\ntotal time: {time.perf_counter() - start:.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rows": rows, "not_made": [
            {"model": m, "exporter": e, "axes": a, "error": err} for (m, e, a), err in errors]}, indent=1))
    failed = any(parity_label(r) in ("FAIL", "ERROR") for r in rows)
    return 1 if args.strict and failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--filter", default="", help="only models whose name (or 'name exporter axes') contains this")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--no-time", action="store_true", help="correctness only")
    p.add_argument("--repeat", type=int, default=5, help="at least this many timed runs per runtime")
    p.add_argument("--min-time", type=float, default=0.5, help="at least this many seconds per runtime")
    p.add_argument("--profile-repeat", type=int, default=3, help="runs of gpukernels.profile per export (0: none)")
    p.add_argument("--cache", default=str(pathlib.Path.home() / ".cache" / "gpukernels-bench"))
    p.add_argument("--reexport", action="store_true", help="export again even when cached (failures too)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if gpukernels fails an export that onnxruntime runs, or a check fails")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--write-test-exports", metavar="DIR", help="write the tiny CI exports to DIR and exit")
    p.add_argument("--parity", action="store_true",
                   help="compare cpu with cuda (the CuPy simulation) instead of onnxruntime; implies --no-time")
    p.add_argument("--no-quantized", action="store_true", help="with --parity: skip the quantized variants")
    args = p.parse_args(argv)
    if args.parity:
        activate_cupy_simulation()  # before anything imports gpukernels

    if args.write_test_exports:
        write_test_exports(pathlib.Path(args.write_test_exports))
        return 0
    specs = all_specs()
    if args.list:
        for s in specs:
            v = ", ".join(f"{a}/{b}" for a, b in variants_for(s))
            print(f"{s.name:18} {s.family:20} {s.note}  [{v}]")
        return 0
    missing = [m for m in ("torch", "transformers", "onnxscript", "onnxruntime", "sklearn", "skl2onnx")
               if importlib.util.find_spec(m) is None]
    if missing:
        print(f"missing packages: {', '.join(missing)} (pip install -e '.[bench,test]'); "
              "the models that need them are skipped", file=sys.stderr)
    root = cache_root(pathlib.Path(args.cache).expanduser())
    start = time.perf_counter()

    def progress(msg):
        print(f"  [{time.perf_counter() - start:6.0f}s] {msg}", file=sys.stderr, flush=True)

    import onnxruntime

    import gpukernels

    if args.parity:
        return parity_main(args, specs, root, progress)
    print(f"# real-model benchmark: {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M %Z')}; "
          f"gpukernels from {pathlib.Path(gpukernels.__file__).parent}, onnxruntime {onnxruntime.__version__}; "
          f"NumPy {np.__version__}, {blas_description()}; exports in {root}")
    forced = forced_blas_kernel()
    if forced:
        print(f"warning: {forced}", file=sys.stderr)
    rows, export_errors = [], []
    for spec in specs:
        wanted = [v for v in variants_for(spec) if args.filter in f"{spec.name} {v[0]} {v[1]}"]
        if not wanted:
            continue
        exports = ensure_exports(spec, root, args.reexport, progress)
        for v in wanted:
            path, err, _ = exports[v]
            if path is None:
                export_errors.append(((spec.name, v[0], v[1]), err))
                continue
            try:
                row = run_export(spec, v, path, args, progress)
            except Exception as exc:  # a failure of the benchmark itself on one export
                row = {"model": spec.name, "exporter": v[0], "axes": v[1],
                       "error": f"benchmark: {type(exc).__name__}: {exc}"}
            rows.append(row)
            r = row
            status = check_label(r) + (f" ({r['error']})" if "error" in r else "")
            progress(f"{spec.name} {v[0]} {v[1]}: {status[:120]} diff={_fmt_diff(r)} "
                     f"gk={_fmt_ms(r.get('gk_ms'))} ort={_fmt_ms(r.get('ort_ms'))}")
    print_report(rows, export_errors)
    print(f"\ntotal time: {time.perf_counter() - start:.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rows": rows, "export_errors": [
            {"model": m, "exporter": e, "axes": a, "error": err} for (m, e, a), err in export_errors]}, indent=1))
    failed = any(gk_failed(r) for r in rows)
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
