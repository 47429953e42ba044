"""The history rows of a W&B offline run, read from its run-*.wandb file: wandb's transaction log (LevelDB's log
format: 32 KiB blocks of records, each a 7-byte header of CRC, length and type; a 7-byte ":W&B" file header first)
holding wandb's own protobuf Records, parsed with wandb's generated classes (wandb/proto)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    assert data[:4] == b":W&B", "not a W&B transaction log"
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < HEADER:  # the block's tail is padding
            position += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        chunk = data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
        else:
            return  # zeros past the last record


def history(wandb_file: Path) -> list[dict]:
    """Each logged row as {key: value}, `_step` included."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for payload in _payloads(wandb_file.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
