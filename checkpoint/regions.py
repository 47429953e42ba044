"""Regions of a tensor: boxes (one slice per dimension) and the flat ranges ZeRO's fragments are made of, converted both
ways so a fragment's elements are read exactly, never the bounding rows around them.
"""

from __future__ import annotations

import math
from typing import Iterator, Optional, Sequence

Box = tuple[slice, ...]


def box_numel(box: Box) -> int:
    return math.prod(s.stop - s.start for s in box)


def flat_range_boxes(shape: Sequence[int], start: int, stop: int) -> list[Box]:
    """The boxes, in flat order, whose union is flat elements [start, stop) of a tensor of `shape`; each contiguous."""
    if start >= stop:
        return []
    if not shape:
        return [()]
    inner = math.prod(shape[1:])
    rest = [slice(0, size) for size in shape[1:]]
    first_row, last_row = start // inner, (stop - 1) // inner
    head, tail = start - first_row * inner, stop - last_row * inner
    if first_row == last_row:
        if head == 0 and tail == inner:
            return [(slice(first_row, first_row + 1), *rest)]
        return [(slice(first_row, first_row + 1), *box) for box in flat_range_boxes(shape[1:], head, tail)]
    boxes: list[Box] = []
    whole_from = first_row
    if head:
        boxes += [(slice(first_row, first_row + 1), *box) for box in flat_range_boxes(shape[1:], head, inner)]
        whole_from += 1
    whole_to = last_row + 1 if tail == inner else last_row
    if whole_to > whole_from:
        boxes.append((slice(whole_from, whole_to), *rest))
    if tail != inner:
        boxes += [(slice(last_row, last_row + 1), *box) for box in flat_range_boxes(shape[1:], 0, tail)]
    return boxes


def flat_start(shape: Sequence[int], box: Box) -> int:
    """The flat index of a box's first element in a tensor of `shape`."""
    index = 0
    for size, part in zip(shape, box):
        index = index * size + part.start
    return index


def box_runs(shape: Sequence[int], box: Box) -> Iterator[tuple[int, int, int]]:
    """(flat start in the tensor, flat start in the box, length) of each contiguous stretch of `box`, in order."""
    dims = len(shape)
    # A run is one index of every outer dimension times the partial dimension times the whole inner ones.
    cut = dims
    while cut > 0 and box[cut - 1].start == 0 and box[cut - 1].stop == shape[cut - 1]:
        cut -= 1
    if cut == 0:
        yield 0, 0, math.prod(shape)
        return
    inner = math.prod(shape[cut:])
    length = (box[cut - 1].stop - box[cut - 1].start) * inner
    outer = [range(part.start, part.stop) for part in box[:cut - 1]]
    strides = [math.prod(shape[d + 1:]) for d in range(dims)]
    position = 0
    for index in _product(outer):
        start = sum(i * strides[d] for d, i in enumerate(index)) + box[cut - 1].start * strides[cut - 1]
        yield start, position, length
        position += length


def _product(ranges: list[range]) -> Iterator[tuple[int, ...]]:
    if not ranges:
        yield ()
        return
    for head in ranges[0]:
        for rest in _product(ranges[1:]):
            yield (head, *rest)


def intersect(a: Box, b: Box) -> Optional[Box]:
    """The box both cover, or None."""
    parts = tuple(slice(max(x.start, y.start), min(x.stop, y.stop)) for x, y in zip(a, b))
    return parts if all(part.start < part.stop for part in parts) else None


def shift(box: Box, offset: Sequence[int]) -> Box:
    """`box` moved by `offset` (a negative offset moves it back)."""
    return tuple(slice(part.start + o, part.stop + o) for part, o in zip(box, offset))


def relative(box: Box, within: Box) -> Box:
    """`box` in the coordinates of the box `within` that contains it."""
    return tuple(slice(part.start - w.start, part.stop - w.start) for part, w in zip(box, within))
