"""vps's regions as the framework checks (tests/megatron, tests/torch)
index them."""
import numpy as np


def box_index(lo, hi, offset, strides):
    """The buffer offsets of a region's box, as an array of the box's shape."""
    idx = np.full(tuple(h - l for l, h in zip(lo, hi)), offset, dtype=np.int64)
    for k, (l, h, s) in enumerate(zip(lo, hi, strides)):
        shape = [1] * len(lo)
        shape[k] = h - l
        idx += (np.arange(h - l, dtype=np.int64) * s).reshape(shape)
    return idx
