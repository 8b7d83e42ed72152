"""NonMaxSuppression (the IoU test in float32, as the results depend on it)."""

from __future__ import annotations

import numpy as np

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


def nms(boxes, scores, max_out, iou, score_thr, center):
    """NonMaxSuppression's selected [batch, class, box] rows, pair by pair, with the IoU
    test in float32."""
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
