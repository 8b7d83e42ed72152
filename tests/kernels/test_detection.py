"""NonMaxSuppression and RoiAlign against plain loop references (NonMaxSuppression's in
tests/reference, with the IoU in float32 exactly as specified).  NonMaxSuppression's host
path (one (batch, class) pair at a time, y-sweep for the overlapping pairs, greedy
resolution) is checked against the reference and against the block path (the option
paths='reference')."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import detection
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.detection import NonMaxSuppression, RoiAlign
from tests.reference import nms as ref_nms


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


def test_nms_dense_overlap_many_blocks(device, rng, tuning):
    boxes = random_boxes(rng, 1, 700, spread=40.0)
    scores = rng.random((1, 1, 700)).astype(np.float32)
    tuning({"nms.block": 64})
    k = NonMaxSuppression(KernelContext(device))
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
def test_nms_partial_sort_with_ties(device, rng, tuning, max_out, nc):
    # few distinct scores: many ties straddle the partial-sort boundary; small blocks so
    # that the head (4 blocks) is exceeded and the full sort takes over for some pairs
    boxes = random_boxes(rng, 2, 400, spread=60.0)
    scores = (rng.integers(0, 12, (2, nc, 400)) / 12).astype(np.float32)
    tuning({"nms.block": 16})
    k = NonMaxSuppression(KernelContext(device))
    y = k(boxes, scores, np.int64(max_out), np.float32(0.1), np.float32(0.05))
    np.testing.assert_array_equal(y.numpy(), ref_nms(boxes, scores, max_out, 0.1, np.float32(0.05), 0))


# ---------------------------------------------------------------------------- NonMaxSuppression host path


def boxes_of(rng, nb, n, spread, lo, hi, center=False, grid=False):
    xy = rng.uniform(0, spread, (nb, n, 2))
    wh = rng.uniform(lo, hi, (nb, n, 2))
    if grid:  # integer corners: many IoUs exactly at simple thresholds (1/2, 1/3, 1/4)
        xy, wh = np.floor(xy), np.floor(wh)
    if center:
        return np.concatenate([xy + wh / 2, wh], -1).astype(np.float32)
    b = np.concatenate([xy, xy + wh], -1)
    flip = rng.random((nb, n)) < 0.3  # some corners given swapped
    b[flip] = b[flip][:, [2, 3, 0, 1]]
    return b.astype(np.float32)


def run_nms(boxes, scores, max_out, iou, score_thr=None, center=0, device="cpu", blocks=False):
    # the block path: the reference; else the host path where it applies
    k = NonMaxSuppression(KernelContext(device, options={"paths": "reference" if blocks else "auto"}))
    y = k(boxes, scores, np.array([max_out], np.int64), np.array([iou], np.float32),
          None if score_thr is None else np.array([score_thr], np.float32), center_point_box=center)
    assert y.data_type == 7
    return y.numpy()


def check_nms(boxes, scores, max_out, iou, score_thr=None, center=0, device="cpu"):
    exp = ref_nms(boxes, scores, max_out, iou, score_thr, center)
    np.testing.assert_array_equal(run_nms(boxes, scores, max_out, iou, score_thr, center, device), exp)
    if device == "cpu":
        np.testing.assert_array_equal(
            run_nms(boxes, scores, max_out, iou, score_thr, center, device, blocks=True), exp)


@pytest.mark.parametrize("nb,nc,n", [(1, 1, 300), (2, 3, 120), (1, 2, 1), (3, 1, 9)])
@pytest.mark.parametrize("max_out", [1, 7, 60, 10000])
@pytest.mark.parametrize("iou", [0.0, 0.25, 0.5, 0.9])
def test_random_overlapping(device, rng, nb, nc, n, max_out, iou):
    boxes = boxes_of(rng, nb, n, 60.0, 3, 25)
    scores = rng.random((nb, nc, n)).astype(np.float32)
    scores[..., ::5] = 0.5  # ties
    check_nms(boxes, scores, max_out, iou, device=device)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("score_thr", [None, 0.3, 0.99, -1.0])
def test_score_threshold_and_center(device, rng, center, score_thr):
    boxes = boxes_of(rng, 2, 200, 50.0, 2, 20, center=center)
    scores = (rng.integers(0, 20, (2, 3, 200)) / 20).astype(np.float32)  # many ties
    check_nms(boxes, scores, 30, 0.4, score_thr, center, device)


@pytest.mark.parametrize("iou", [0.5, 1 / 3, 0.25, 0.0, 1.0])
def test_boundary_ious_on_a_grid(device, rng, iou):
    # integer boxes on a small grid: many pairs have IoU exactly at the threshold,
    # which must not suppress (strict >, compared in float32)
    boxes = boxes_of(rng, 1, 250, 12.0, 1, 6, grid=True)
    scores = rng.random((1, 2, 250)).astype(np.float32)
    check_nms(boxes, scores, 250, iou, device=device)


def test_exact_threshold_pair(device):
    two = np.array([[[0, 0, 2, 2], [0, 0, 2, 1], [0, 0, 1, 2]]], np.float32)  # IoU 1/2 each with box 0
    scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    for iou in (0.5, np.nextafter(np.float32(0.5), np.float32(0))):
        check_nms(two, scores, 3, iou, device=device)


def test_many_candidates_suppressed_needs_more_chunks(device, rng):
    # dense clusters: most candidates are suppressed, so the first chunk (about 1.25 x
    # max_output) is not enough and later chunks are swept with the boxes selected so far
    centers = rng.uniform(0, 400, (40, 2))
    pick = rng.integers(0, 40, 900)
    xy = centers[pick] + rng.normal(0, 1.5, (900, 2))
    boxes = np.concatenate([xy, xy + 20], 1)[None].astype(np.float32)
    scores = rng.random((1, 1, 900)).astype(np.float32)
    for max_out in (30, 45, 900):
        check_nms(boxes, scores, max_out, 0.5, device=device)


def test_chain_of_suppressions(device):
    # each box overlaps the next by IoU > 0.5: the greedy keeps every other box
    n = 40
    x = np.arange(n, dtype=np.float32) * 3
    boxes = np.stack([np.zeros(n), x, np.full(n, 10), x + 10], 1)[None].astype(np.float32)
    scores = np.linspace(1, 0.1, n, dtype=np.float32)[None, None]
    check_nms(boxes, scores, n, 0.5, device=device)
    check_nms(boxes, scores, 5, 0.5, device=device)


def test_many_edges_fixed_point(device, rng):
    # nearly identical boxes: more than 4096 suppression edges inside one chunk, resolved
    # by the matrix fixed point instead of the edge loop
    xy = rng.uniform(0, 3, (300, 2))
    boxes = np.concatenate([xy, xy + 30], 1)[None].astype(np.float32)
    scores = rng.random((1, 1, 300)).astype(np.float32)
    check_nms(boxes, scores, 300, 0.7, device=device)
    check_nms(boxes, scores, 300, 0.95, device=device)


def test_tall_boxes_and_degenerate(device, rng):
    boxes = boxes_of(rng, 1, 150, 80.0, 2, 15)
    boxes[0, ::10, 0] = -1000  # a few very tall boxes: long sweep windows
    boxes[0, ::10, 2] = 1000
    boxes[0, 5::17, 2] = boxes[0, 5::17, 0]  # zero height: never suppresses
    boxes[0, 6::17, 3] = boxes[0, 6::17, 1]  # zero width
    boxes[0, 7] = boxes[0, 8]  # identical boxes
    boxes[0, 9] = [5, 5, 5, 5]  # a point
    boxes[0, 11] = [5, 5, 5, 5]
    scores = rng.random((1, 1, 150)).astype(np.float32)
    check_nms(boxes, scores, 150, 0.3, device=device)
    check_nms(boxes, scores, 150, 0.0, device=device)


def test_nan_scores_and_boxes(device, rng):
    boxes = boxes_of(rng, 1, 120, 40.0, 3, 20)
    boxes[0, 3] = np.nan
    boxes[0, 4, 2] = np.nan
    scores = rng.random((1, 2, 120)).astype(np.float32)
    scores[0, 0, [2, 9, 50]] = np.nan  # sorted last (no threshold) or invalid (threshold)
    scores[0, 1, 3] = 2.0  # the NaN box first
    with np.errstate(invalid="ignore"):
        check_nms(boxes, scores, 120, 0.3, device=device)
        check_nms(boxes, scores, 10, 0.3, device=device)
        check_nms(boxes, scores, 120, 0.3, 0.2, device=device)


def test_signed_zero_and_infinite_scores(device, rng):
    boxes = boxes_of(rng, 1, 60, 30.0, 3, 15)
    scores = rng.random((1, 1, 60)).astype(np.float32)
    scores[0, 0, ::3] = 0.0
    scores[0, 0, 1::6] = -0.0  # equal to 0.0: ties by index
    scores[0, 0, 2::11] = np.inf
    scores[0, 0, 4::13] = -np.inf
    check_nms(boxes, scores, 60, 0.2, device=device)
    check_nms(boxes, scores, 25, 0.2, device=device)


def test_empty_and_zero_outputs(device, rng):
    boxes = boxes_of(rng, 2, 30, 30.0, 3, 15)
    scores = rng.random((2, 2, 30)).astype(np.float32)
    assert run_nms(boxes, scores, 0, 0.5, device=device).shape == (0, 3)
    assert run_nms(boxes, scores, 5, 0.5, 1.5, device=device).shape == (0, 3)  # nothing above threshold
    empty = run_nms(np.zeros((2, 0, 4), np.float32), np.zeros((2, 2, 0), np.float32), 5, 0.5, device=device)
    assert empty.shape == (0, 3)
    check_nms(boxes, scores, 1, 0.5, device=device)
    # only some pairs have a valid box
    scores[0, 1] = 0.0
    scores[1, 0] = 0.0
    check_nms(boxes, scores, 4, 0.5, 0.1, device=device)


def test_workspace_limit_falls_back_to_blocks(device, rng, tuning):
    tuning({"nms.pair_budget": 50})
    boxes = boxes_of(rng, 2, 200, 40.0, 3, 20)
    scores = rng.random((2, 2, 200)).astype(np.float32)
    check_nms(boxes, scores, 40, 0.3, device=device)


def test_many_pairs_use_blocks(device, rng, tuning):
    tuning({"nms.host_pairs": 2})
    k = NonMaxSuppression(KernelContext(device, options={"paths": "auto"}))
    boxes = boxes_of(rng, 2, 80, 40.0, 3, 20)
    scores = rng.random((2, 3, 80)).astype(np.float32)
    y = k(boxes, scores, np.int64(20), np.float32(0.3), np.float32(0.2))
    np.testing.assert_array_equal(y.numpy(), ref_nms(boxes, scores, 20, 0.3, 0.2, 0))


def test_non_contiguous_inputs(device, rng):
    boxes = boxes_of(rng, 1, 100, 40.0, 3, 20)
    big = np.zeros((1, 100, 8), np.float32)
    big[..., ::2] = boxes
    scores = rng.random((1, 2, 100)).astype(np.float32)
    check_nms(big[..., ::2], scores[:, ::-1], 30, 0.4, device=device)


@pytest.mark.parametrize("budget", [None, 3000])
def test_later_chunks_against_many_selected(device, rng, monkeypatch, tuning, budget):
    """Candidates of later chunks checked against the boxes selected before them
    (detection._cross_hits: a y-window per candidate, pairs in groups of at most
    nms.pair_budget); with tall, zero-height and NaN boxes among them."""
    if budget:
        tuning({"nms.pair_budget": budget})
    calls = []
    real = detection._cross_hits
    monkeypatch.setattr(detection, "_cross_hits", lambda *a: calls.append(a[0].shape[1]) or real(*a))
    boxes = boxes_of(rng, 1, 900, 120.0, 2, 30)
    boxes[0, 7::53, 2] = boxes[0, 7::53, 0] + 100  # tall
    boxes[0, 5::41, 2] = boxes[0, 5::41, 0]  # zero height
    boxes[0, ::37, 1] = np.nan
    scores = rng.random((1, 2, 900)).astype(np.float32)
    check_nms(boxes, scores, 300, 0.3, device=device)
    if device == "cpu":
        assert calls and max(calls) > 100  # later chunks met over a hundred selected boxes
