"""NonMaxSuppression host fast path (one (batch, class) pair at a time, y-sweep for the
overlapping pairs, greedy resolution) and the block path, against a plain-loop greedy
reference computing the IoU in float32 exactly as specified."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels import detection
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.detection import NonMaxSuppression

# these tests check the host specialisation itself
pytestmark = pytest.mark.usefixtures("default_paths")

F = np.float32


def _corners(box, center):
    a, b, c, d = (F(v) for v in box)
    if center:  # [x_center, y_center, width, height]
        lo_x, hi_x = a - c / F(2), a + c / F(2)
        lo_y, hi_y = b - d / F(2), b + d / F(2)
    else:  # [y1, x1, y2, x2], corners in any order
        lo_y, lo_x, hi_y, hi_x = a, b, c, d
    return (np.minimum(lo_y, hi_y), np.minimum(lo_x, hi_x),
            np.maximum(lo_y, hi_y), np.maximum(lo_x, hi_x))


def _suppresses(p, q, thr):
    """IoU(p, q) > thr in float32; boxes with zero area or no overlap never suppress
    (NaN coordinates propagate through minimum/maximum and fail every test)."""
    ih = np.minimum(p[2], q[2]) - np.maximum(p[0], q[0])
    iw = np.minimum(p[3], q[3]) - np.maximum(p[1], q[1])
    inter = np.maximum(ih, F(0)) * np.maximum(iw, F(0))
    ap = (p[2] - p[0]) * (p[3] - p[1])
    aq = (q[2] - q[0]) * (q[3] - q[1])
    union = ap + aq - inter
    if not (inter > 0 and ap > 0 and aq > 0 and union > 0):
        return False
    return bool(inter / union > F(thr))


def reference(boxes, scores, max_out, iou, score_thr, center):
    rows = []
    nb, nc, n = scores.shape
    for b in range(nb):
        corners = [_corners(boxes[b, i], center) for i in range(n)]
        for c in range(nc):
            s = scores[b, c]
            cand = [i for i in range(n) if score_thr is None or s[i] > F(score_thr)]
            # decreasing score, ties by lower index, NaN scores last
            cand.sort(key=lambda i: (bool(np.isnan(s[i])), 0.0 if np.isnan(s[i]) else -float(s[i]), i))
            sel = []
            for i in cand:
                if len(sel) >= max_out:
                    break
                if not any(_suppresses(corners[j], corners[i], iou) for j in sel):
                    sel.append(i)
            rows += [[b, c, i] for i in sel]
    return np.array(rows, np.int64).reshape(-1, 3)


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


def run(boxes, scores, max_out, iou, score_thr=None, center=0, device="cpu", blocks=False):
    k = NonMaxSuppression(KernelContext(device))
    if blocks:
        k.host_pairs = -1  # every call through the vectorised block path
    y = k(boxes, scores, np.array([max_out], np.int64), np.array([iou], np.float32),
          None if score_thr is None else np.array([score_thr], np.float32), center_point_box=center)
    assert y.data_type == 7
    return y.numpy()


def check(boxes, scores, max_out, iou, score_thr=None, center=0, device="cpu"):
    exp = reference(boxes, scores, max_out, iou, score_thr, center)
    np.testing.assert_array_equal(run(boxes, scores, max_out, iou, score_thr, center, device), exp)
    if device == "cpu":
        np.testing.assert_array_equal(
            run(boxes, scores, max_out, iou, score_thr, center, device, blocks=True), exp)


@pytest.mark.parametrize("nb,nc,n", [(1, 1, 300), (2, 3, 120), (1, 2, 1), (3, 1, 9)])
@pytest.mark.parametrize("max_out", [1, 7, 60, 10000])
@pytest.mark.parametrize("iou", [0.0, 0.25, 0.5, 0.9])
def test_random_overlapping(device, rng, nb, nc, n, max_out, iou):
    boxes = boxes_of(rng, nb, n, 60.0, 3, 25)
    scores = rng.random((nb, nc, n)).astype(np.float32)
    scores[..., ::5] = 0.5  # ties
    check(boxes, scores, max_out, iou, device=device)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("score_thr", [None, 0.3, 0.99, -1.0])
def test_score_threshold_and_center(device, rng, center, score_thr):
    boxes = boxes_of(rng, 2, 200, 50.0, 2, 20, center=center)
    scores = (rng.integers(0, 20, (2, 3, 200)) / 20).astype(np.float32)  # many ties
    check(boxes, scores, 30, 0.4, score_thr, center, device)


@pytest.mark.parametrize("iou", [0.5, 1 / 3, 0.25, 0.0, 1.0])
def test_boundary_ious_on_a_grid(device, rng, iou):
    # integer boxes on a small grid: many pairs have IoU exactly at the threshold,
    # which must not suppress (strict >, compared in float32)
    boxes = boxes_of(rng, 1, 250, 12.0, 1, 6, grid=True)
    scores = rng.random((1, 2, 250)).astype(np.float32)
    check(boxes, scores, 250, iou, device=device)


def test_exact_threshold_pair(device):
    two = np.array([[[0, 0, 2, 2], [0, 0, 2, 1], [0, 0, 1, 2]]], np.float32)  # IoU 1/2 each with box 0
    scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    for iou in (0.5, np.nextafter(F(0.5), F(0))):
        check(two, scores, 3, iou, device=device)


def test_many_candidates_suppressed_needs_more_chunks(device, rng):
    # dense clusters: most candidates are suppressed, so the first chunk (about 1.25 x
    # max_output) is not enough and later chunks are swept with the boxes selected so far
    centers = rng.uniform(0, 400, (40, 2))
    pick = rng.integers(0, 40, 900)
    xy = centers[pick] + rng.normal(0, 1.5, (900, 2))
    boxes = np.concatenate([xy, xy + 20], 1)[None].astype(np.float32)
    scores = rng.random((1, 1, 900)).astype(np.float32)
    for max_out in (30, 45, 900):
        check(boxes, scores, max_out, 0.5, device=device)


def test_chain_of_suppressions(device):
    # each box overlaps the next by IoU > 0.5: the greedy keeps every other box
    n = 40
    x = np.arange(n, dtype=np.float32) * 3
    boxes = np.stack([np.zeros(n), x, np.full(n, 10), x + 10], 1)[None].astype(np.float32)
    scores = np.linspace(1, 0.1, n, dtype=np.float32)[None, None]
    check(boxes, scores, n, 0.5, device=device)
    check(boxes, scores, 5, 0.5, device=device)


def test_many_edges_fixed_point(device, rng):
    # nearly identical boxes: more than 4096 suppression edges inside one chunk, resolved
    # by the matrix fixed point instead of the edge loop
    xy = rng.uniform(0, 3, (300, 2))
    boxes = np.concatenate([xy, xy + 30], 1)[None].astype(np.float32)
    scores = rng.random((1, 1, 300)).astype(np.float32)
    check(boxes, scores, 300, 0.7, device=device)
    check(boxes, scores, 300, 0.95, device=device)


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
    check(boxes, scores, 150, 0.3, device=device)
    check(boxes, scores, 150, 0.0, device=device)


def test_nan_scores_and_boxes(device, rng):
    boxes = boxes_of(rng, 1, 120, 40.0, 3, 20)
    boxes[0, 3] = np.nan
    boxes[0, 4, 2] = np.nan
    scores = rng.random((1, 2, 120)).astype(np.float32)
    scores[0, 0, [2, 9, 50]] = np.nan  # sorted last (no threshold) or invalid (threshold)
    scores[0, 1, 3] = 2.0  # the NaN box first
    with np.errstate(invalid="ignore"):
        check(boxes, scores, 120, 0.3, device=device)
        check(boxes, scores, 10, 0.3, device=device)
        check(boxes, scores, 120, 0.3, 0.2, device=device)


def test_signed_zero_and_infinite_scores(device, rng):
    boxes = boxes_of(rng, 1, 60, 30.0, 3, 15)
    scores = rng.random((1, 1, 60)).astype(np.float32)
    scores[0, 0, ::3] = 0.0
    scores[0, 0, 1::6] = -0.0  # equal to 0.0: ties by index
    scores[0, 0, 2::11] = np.inf
    scores[0, 0, 4::13] = -np.inf
    check(boxes, scores, 60, 0.2, device=device)
    check(boxes, scores, 25, 0.2, device=device)


def test_empty_and_zero_outputs(device, rng):
    boxes = boxes_of(rng, 2, 30, 30.0, 3, 15)
    scores = rng.random((2, 2, 30)).astype(np.float32)
    assert run(boxes, scores, 0, 0.5, device=device).shape == (0, 3)
    assert run(boxes, scores, 5, 0.5, 1.5, device=device).shape == (0, 3)  # nothing above threshold
    empty = run(np.zeros((2, 0, 4), np.float32), np.zeros((2, 2, 0), np.float32), 5, 0.5, device=device)
    assert empty.shape == (0, 3)
    check(boxes, scores, 1, 0.5, device=device)
    # only some pairs have a valid box
    scores[0, 1] = 0.0
    scores[1, 0] = 0.0
    check(boxes, scores, 4, 0.5, 0.1, device=device)


def test_workspace_limit_falls_back_to_blocks(device, rng, monkeypatch):
    monkeypatch.setattr(detection, "_PAIR_BUDGET", 50)
    boxes = boxes_of(rng, 2, 200, 40.0, 3, 20)
    scores = rng.random((2, 2, 200)).astype(np.float32)
    check(boxes, scores, 40, 0.3, device=device)


def test_many_pairs_use_blocks(device, rng):
    k = NonMaxSuppression(KernelContext(device))
    k.host_pairs = 2
    boxes = boxes_of(rng, 2, 80, 40.0, 3, 20)
    scores = rng.random((2, 3, 80)).astype(np.float32)
    y = k(boxes, scores, np.int64(20), np.float32(0.3), np.float32(0.2))
    np.testing.assert_array_equal(y.numpy(), reference(boxes, scores, 20, 0.3, 0.2, 0))


def test_non_contiguous_inputs(device, rng):
    boxes = boxes_of(rng, 1, 100, 40.0, 3, 20)
    big = np.zeros((1, 100, 8), np.float32)
    big[..., ::2] = boxes
    scores = rng.random((1, 2, 100)).astype(np.float32)
    check(big[..., ::2], scores[:, ::-1], 30, 0.4, device=device)


@pytest.mark.parametrize("budget", [None, 3000])
def test_later_chunks_against_many_selected(device, rng, monkeypatch, budget):
    """Candidates of later chunks checked against the boxes selected before them
    (detection._cross_hits: a y-window per candidate, pairs in groups of at most
    _PAIR_BUDGET); with tall, zero-height and NaN boxes among them."""
    if budget:
        monkeypatch.setattr(detection, "_PAIR_BUDGET", budget)
    calls = []
    real = detection._cross_hits
    monkeypatch.setattr(detection, "_cross_hits", lambda *a: calls.append(a[0].shape[1]) or real(*a))
    boxes = boxes_of(rng, 1, 900, 120.0, 2, 30)
    boxes[0, 7::53, 2] = boxes[0, 7::53, 0] + 100  # tall
    boxes[0, 5::41, 2] = boxes[0, 5::41, 0]  # zero height
    boxes[0, ::37, 1] = np.nan
    scores = rng.random((1, 2, 900)).astype(np.float32)
    check(boxes, scores, 300, 0.3, device=device)
    if device == "cpu":
        assert calls and max(calls) > 100  # later chunks met over a hundred selected boxes
