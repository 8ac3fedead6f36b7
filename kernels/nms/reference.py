"""Greedy non-maximum suppression, the plain numpy reference (seed 003's NMS post):
visit boxes by falling score, keep one, drop every later box whose IoU with it
exceeds the threshold."""

import numpy as np

IOU_THRESHOLD = 0.5


def _iou_one_to_many(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    lt = np.maximum(box[:2], boxes[:, :2])
    rb = np.minimum(box[2:], boxes[:, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[:, 0] * wh[:, 1]
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (area + areas - inter)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float = IOU_THRESHOLD) -> np.ndarray:
    """Indices of the kept boxes, highest score first."""
    boxes = boxes.astype(np.float64)
    order = np.argsort(-scores, kind="stable")
    suppressed = np.zeros(len(boxes), dtype=bool)
    keep = []
    for position, index in enumerate(order):
        if suppressed[index]:
            continue
        keep.append(index)
        later = order[position + 1:]
        suppressed[later[_iou_one_to_many(boxes[index], boxes[later]) > iou_threshold]] = True
    return np.array(keep, dtype=np.int64)


def make_inputs(seed: int, boxes: int) -> tuple[np.ndarray, np.ndarray]:
    """``boxes`` random boxes in [0, 1] (float32, many overlapping) and distinct scores."""
    rng = np.random.default_rng(seed)
    corner = rng.random((boxes, 2), dtype=np.float32) * 0.9
    size = rng.random((boxes, 2), dtype=np.float32) * 0.3 + 0.01
    scores = rng.permutation(boxes).astype(np.float32) / boxes  # distinct: no tie-break ambiguity
    return np.concatenate([corner, corner + size], axis=-1), scores


def kept(output) -> np.ndarray:
    """Any implementation's answer as the sorted set of kept indices: an index list,
    or a keep mask in input order."""
    output = np.asarray(output)
    indices = np.flatnonzero(output) if output.dtype == bool else output.astype(np.int64)
    return np.sort(indices)
