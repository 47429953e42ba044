"""TensorBoard scalars from the metrics records (`--tensorboard-dir`), tagged with Megatron-LM's names as W&B gets them,
plus its `<name> vs samples`; torch.utils.tensorboard is imported only when the flag is given."""

from __future__ import annotations

import sys
from typing import Any


class TensorBoardSink:
    def __init__(self, directory: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=directory)

    def write(self, values: dict[str, float], step: int) -> None:
        try:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, global_step=step)
        except Exception as error:  # noqa: BLE001 - logging trouble must never stop training
            print(f"warning: TensorBoard write failed, continuing without it: {error}", file=sys.stderr)

    def close(self) -> None:
        self.writer.close()


def open_tensorboard(directory: Any) -> "TensorBoardSink | None":
    """A sink writing into `directory`, or None when TensorBoard cannot start."""
    if not directory:
        return None
    try:
        return TensorBoardSink(str(directory))
    except Exception as error:  # noqa: BLE001 - e.g. the tensorboard package missing
        print(f"warning: TensorBoard did not start ({error}); training continues without it", file=sys.stderr)
        return None
