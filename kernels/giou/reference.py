"""GIoU of paired boxes (x0, y0, x1, y1), the plain numpy reference in float64.

Follows the seed's naive PyTorch version (004, after torchvision's
generalized_box_iou_loss), including its epsilon clamps."""

import numpy as np

EPSILON = 1e-5


def giou(boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    boxes1, boxes2 = boxes1.astype(np.float64), boxes2.astype(np.float64)
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[..., 2] - boxes2[..., 0]) * (boxes2[..., 3] - boxes2[..., 1])
    wh = np.clip(np.minimum(boxes1[..., 2:], boxes2[..., 2:]) - np.maximum(boxes1[..., :2], boxes2[..., :2]), 0, None)
    inter = wh[..., 0] * wh[..., 1]
    union = area1 + area2 - inter
    iou = inter / np.maximum(union, EPSILON)
    whi = np.clip(np.maximum(boxes1[..., 2:], boxes2[..., 2:]) - np.minimum(boxes1[..., :2], boxes2[..., :2]), 0, None)
    enclosing = np.maximum(whi[..., 0] * whi[..., 1], EPSILON)
    return iou - (enclosing - union) / enclosing


def make_inputs(seed: int, batch: int, boxes: int) -> tuple[np.ndarray, np.ndarray]:
    """Two (batch, boxes, 4) float32 arrays of valid boxes (x0 < x1, y0 < y1) in [0, 1]."""
    rng = np.random.default_rng(seed)

    def random_boxes():
        corner = rng.random((batch, boxes, 2), dtype=np.float32) * 0.8
        size = rng.random((batch, boxes, 2), dtype=np.float32) * 0.2 + 0.01
        return np.concatenate([corner, corner + size], axis=-1)

    return random_boxes(), random_boxes()
