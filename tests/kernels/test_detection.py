"""NonMaxSuppression and RoiAlign against plain loop references."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.detection import NonMaxSuppression, RoiAlign


def ref_nms(boxes, scores, max_out, iou_thr, score_thr, center):
    out = []
    nb, nc, n = scores.shape
    for b in range(nb):
        bx = boxes[b].astype(np.float32)
        if center:
            cx, cy, w, h = bx.T
            c = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], 1)
        else:
            c = bx
        ymin, xmin = np.minimum(c[:, 0], c[:, 2]), np.minimum(c[:, 1], c[:, 3])
        ymax, xmax = np.maximum(c[:, 0], c[:, 2]), np.maximum(c[:, 1], c[:, 3])
        for cl in range(nc):
            cand = [i for i in range(n) if score_thr is None or scores[b, cl, i] > score_thr]
            cand.sort(key=lambda i: (-scores[b, cl, i], i))
            sel = []
            for i in cand:
                if len(sel) >= max_out:
                    break
                ok = True
                for j in sel:
                    ih = min(ymax[i], ymax[j]) - max(ymin[i], ymin[j])
                    iw = min(xmax[i], xmax[j]) - max(xmin[i], xmin[j])
                    inter = max(ih, 0) * max(iw, 0)
                    ai = (ymax[i] - ymin[i]) * (xmax[i] - xmin[i])
                    aj = (ymax[j] - ymin[j]) * (xmax[j] - xmin[j])
                    if inter > 0 and ai > 0 and aj > 0 and inter / (ai + aj - inter) > iou_thr:
                        ok = False
                        break
                if ok:
                    sel.append(i)
            out += [[b, cl, i] for i in sel]
    return np.array(out, np.int64).reshape(-1, 3)


def random_boxes(rng, nb, n, center=False, spread=100.0):
    xy = rng.uniform(0, spread, (nb, n, 2))
    wh = rng.uniform(5, 30, (nb, n, 2))
    if center:
        return np.concatenate([xy, wh], -1).astype(np.float32)
    b = np.concatenate([xy, xy + wh], -1)
    flip = rng.random((nb, n)) < 0.3  # some boxes given with swapped corners
    b[flip] = b[flip][:, [2, 3, 0, 1]]
    return b.astype(np.float32)


@pytest.mark.parametrize("nb,nc,n", [(1, 1, 50), (2, 3, 300), (3, 2, 7)])
@pytest.mark.parametrize("max_out", [1, 5, 1000])
@pytest.mark.parametrize("iou", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("score_thr", [None, 0.4])
@pytest.mark.parametrize("center", [0, 1])
def test_nms_random(device, rng, nb, nc, n, max_out, iou, score_thr, center):
    boxes = random_boxes(rng, nb, n, center)
    scores = rng.random((nb, nc, n)).astype(np.float32)
    scores[..., ::7] = 0.5  # ties
    y = NonMaxSuppression(KernelContext(device))(
        boxes, scores, np.array([max_out]), np.array([iou], np.float32),
        None if score_thr is None else np.array([score_thr], np.float32), center_point_box=center)
    exp = ref_nms(boxes, scores, max_out, iou, score_thr, center)
    assert y.data_type == 7
    np.testing.assert_array_equal(y.numpy(), exp)


def test_nms_dense_overlap_many_blocks(device, rng):
    boxes = random_boxes(rng, 1, 700, spread=40.0)
    scores = rng.random((1, 1, 700)).astype(np.float32)
    k = NonMaxSuppression(KernelContext(device))
    k.block = 64
    y = k(boxes, scores, np.int64(10000), np.float32(0.2))
    np.testing.assert_array_equal(y.numpy(), ref_nms(boxes, scores, 10000, 0.2, None, 0))


def test_nms_edge_cases(device, rng):
    k = NonMaxSuppression(KernelContext(device))
    boxes, scores = random_boxes(rng, 1, 5), rng.random((1, 2, 5)).astype(np.float32)
    assert k(boxes, scores).shape == (0, 3)  # max_output_boxes_per_class defaults to 0
    assert k(boxes, scores, np.int64(0)).shape == (0, 3)
    assert k(np.zeros((1, 0, 4), np.float32), np.zeros((1, 1, 0), np.float32), np.int64(3)).shape == (0, 3)
    # identical boxes: IoU 1 > threshold; the first index wins on equal scores
    same = np.tile(np.array([[0, 0, 1, 1]], np.float32), (1, 4, 1))
    y = k(same, np.ones((1, 1, 4), np.float32), np.int64(4), np.float32(0.5)).numpy()
    np.testing.assert_array_equal(y, [[0, 0, 0]])
    # IoU exactly at the threshold is kept
    two = np.array([[[0, 0, 1, 2], [0, 1, 1, 3]]], np.float32)  # IoU = 1/3
    y = k(two, np.array([[[0.9, 0.8]]], np.float32), np.int64(2), np.float32(1 / 3)).numpy()
    assert len(y) in (1, 2)
    np.testing.assert_array_equal(y, ref_nms(two, np.array([[[0.9, 0.8]]], np.float32), 2, np.float32(1 / 3), None, 0))


def test_nms_errors(device, rng):
    k = NonMaxSuppression(KernelContext(device))
    with pytest.raises(KernelInputError, match="NonMaxSuppression.*boxes must be"):
        k(np.zeros((1, 5, 3), np.float32), np.zeros((1, 1, 5), np.float32), np.int64(1))
    with pytest.raises(KernelInputError, match="disagree"):
        k(np.zeros((1, 5, 4), np.float32), np.zeros((1, 1, 4), np.float32), np.int64(1))
    with pytest.raises(KernelInputError, match="iou_threshold"):
        k(np.zeros((1, 5, 4), np.float32), np.zeros((1, 1, 5), np.float32), np.int64(1), np.float32(1.5))
    with pytest.raises(KernelInputError, match="center_point_box"):
        k(np.zeros((1, 5, 4), np.float32), np.zeros((1, 1, 5), np.float32), np.int64(1), center_point_box=2)
    with pytest.raises(KernelTypeError):
        k(np.zeros((1, 5, 4), np.float64), np.zeros((1, 1, 5), np.float32), np.int64(1))


def ref_bilinear(img, y, x):
    h, w = img.shape[-2:]
    if y < -1 or y > h or x < -1 or x > w:
        return [0 * img[..., 0, 0]] * 4, [0, 0, 0, 0]
    y, x = max(y, 0.0), max(x, 0.0)
    yl, xl = int(y), int(x)
    if yl >= h - 1:
        yl = yh = h - 1
        y = float(yl)
    else:
        yh = yl + 1
    if xl >= w - 1:
        xl = xh = w - 1
        x = float(xl)
    else:
        xh = xl + 1
    ly, lx = y - yl, x - xl
    hy, hx = 1 - ly, 1 - lx
    return [img[..., yl, xl], img[..., yl, xh], img[..., yh, xl], img[..., yh, xh]], [hy * hx, hy * lx, ly * hx, ly * lx]


def ref_roi_align(x, rois, bidx, mode, oh, ow, ratio, scale, half):
    r = len(rois)
    c = x.shape[1]
    out = np.zeros((r, c, oh, ow))
    for i in range(r):
        off = 0.5 if half else 0.0
        x1, y1, x2, y2 = [float(v) * scale - off for v in rois[i]]
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio if ratio > 0 else math.ceil(rh / oh)
        gw = ratio if ratio > 0 else math.ceil(rw / ow)
        cnt = max(gh * gw, 1)
        img = x[bidx[i]].astype(np.float64)
        for ph in range(oh):
            for pw in range(ow):
                acc = np.zeros(c) if mode == "avg" else np.full(c, -np.inf)
                for iy in range(max(gh, 0)):
                    yy = y1 + ph * bh + (iy + 0.5) * bh / gh
                    for ix in range(max(gw, 0)):
                        xx = x1 + pw * bw + (ix + 0.5) * bw / gw
                        vals, ws = ref_bilinear(img, yy, xx)
                        if mode == "avg":
                            acc += sum(wv * v for wv, v in zip(ws, vals))
                        else:
                            acc = np.maximum(acc, np.max([wv * v for wv, v in zip(ws, vals)], axis=0))
                out[i, :, ph, pw] = acc / cnt if mode == "avg" else np.where(np.isneginf(acc), 0, acc)
    return out


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("ratio", [0, 1, 2])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_roi_align(device, rng, mode, half, ratio, scale):
    x = rng.standard_normal((2, 3, 8, 9)).astype(np.float32)
    rois = np.array([[0, 0, 8, 7], [1.3, 2.2, 5.7, 6.1], [-2, -1, 3, 4], [5, 5, 20, 18], [2, 3, 2.2, 3.1]],
                    np.float32) / scale
    bidx = np.array([0, 1, 1, 0, 1], np.int64)
    y = RoiAlign(KernelContext(device))(x, rois, bidx, mode=mode, output_height=3, output_width=2,
                                         sampling_ratio=ratio, spatial_scale=scale,
                                         coordinate_transformation_mode="half_pixel" if half else "output_half_pixel")
    exp = ref_roi_align(x, rois, bidx, mode, 3, 2, ratio, scale, half)
    np.testing.assert_allclose(y.numpy(), exp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt,tol", [(np.float64, 1e-12), (np.float16, 5e-3), (ml_dtypes.bfloat16, 3e-2)])
def test_roi_align_dtypes_and_opset10(device, rng, dt, tol):
    x = rng.standard_normal((1, 2, 6, 6)).astype(dt)
    rois = np.array([[0.5, 1, 4, 5.5]], dt)
    bidx = np.zeros(1, np.int64)
    y = RoiAlign(KernelContext(device))(x, rois, bidx, output_height=2, output_width=2)
    assert y.dtype == np.dtype(dt)
    exp = ref_roi_align(x.astype(np.float64), rois.astype(np.float64), bidx, "avg", 2, 2, 0, 1.0, True)
    np.testing.assert_allclose(y.numpy().astype(np.float64), exp, rtol=tol, atol=tol)
    if dt != ml_dtypes.bfloat16:
        y10 = RoiAlign(KernelContext(device, 10))(x, rois, bidx, output_height=2, output_width=2)
        exp = ref_roi_align(x.astype(np.float64), rois.astype(np.float64), bidx, "avg", 2, 2, 0, 1.0, False)
        np.testing.assert_allclose(y10.numpy().astype(np.float64), exp, rtol=tol, atol=tol)
    else:
        with pytest.raises(KernelTypeError):
            RoiAlign(KernelContext(device, 16))(x, rois, bidx)


def test_roi_align_edge_and_errors(device, rng):
    k = RoiAlign(KernelContext(device))
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    assert k(x, np.zeros((0, 4), np.float32), np.zeros(0, np.int64), output_height=2).shape == (0, 2, 2, 1)
    with pytest.raises(KernelInputError, match="RoiAlign.*batch_indices"):
        k(x, np.zeros((1, 4), np.float32), np.array([1], np.int64))
    with pytest.raises(KernelInputError, match="rois must be"):
        k(x, np.zeros((1, 5), np.float32), np.array([0], np.int64))
    with pytest.raises(KernelInputError, match="mode"):
        k(x, np.zeros((1, 4), np.float32), np.array([0], np.int64), mode="sum")
    with pytest.raises(KernelInputError, match="X must be 4-D"):
        k(x[0], np.zeros((1, 4), np.float32), np.array([0], np.int64))
    with pytest.raises(KernelTypeError):
        k(x, np.zeros((1, 4), np.float32), np.array([0], np.int32))


@pytest.mark.parametrize("max_out", [3, 20, 60])
@pytest.mark.parametrize("nc", [1, 3])
def test_nms_partial_sort_with_ties(device, rng, max_out, nc):
    # few distinct scores: many ties straddle the partial-sort boundary; small blocks so
    # that the head (4 blocks) is exceeded and the full sort takes over for some pairs
    boxes = random_boxes(rng, 2, 400, spread=60.0)
    scores = (rng.integers(0, 12, (2, nc, 400)) / 12).astype(np.float32)
    k = NonMaxSuppression(KernelContext(device))
    k.block = 16
    y = k(boxes, scores, np.int64(max_out), np.float32(0.1), np.float32(0.05))
    np.testing.assert_array_equal(y.numpy(), ref_nms(boxes, scores, max_out, 0.1, np.float32(0.05), 0))
