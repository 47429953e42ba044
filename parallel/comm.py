"""The one door to collectives: every collective and pipeline send goes through a `Communicator`, which counts the bytes
this rank sends at the ring algorithms' volumes. A group of size 1 or None is skipped, so TP=1 and DP=1 cost nothing.
`DryRunCommunicator` counts without a transport, for the planner."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch
import torch.distributed as dist

from base.eager_under_compile import eager_under_compile
from base.errors import PeerLostError
from rendezvous.collective_log import CollectiveLog, RecordedWork

QUIET_EXITS = (KeyboardInterrupt, SystemExit, GeneratorExit, PeerLostError)
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
P2P_KINDS = ("send", "recv")
GROUP_KINDS = {"dp": COLLECTIVE_KINDS, "tp": COLLECTIVE_KINDS, "pp": P2P_KINDS + ("all_reduce", "broadcast"),
               "embedding": ("all_reduce",),
               "cp": COLLECTIVE_KINDS + P2P_KINDS + ("all_to_all",),
               "amax": ("all_reduce",)}
GROUP_NAMES = tuple(GROUP_KINDS)
EXPERT_GROUP_KINDS = {"ep": ("all_to_all",) + COLLECTIVE_KINDS, "etp": ("all_to_all",) + COLLECTIVE_KINDS,
                      "edp": COLLECTIVE_KINDS, "etp_ep": COLLECTIVE_KINDS}
# counted from first use, so a run without them records the groups it always had
ON_FIRST_USE = ("cp", "amax")

_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def ring_bytes_sent(kind: str, full_bytes: int, group_size: int, is_source: bool = True) -> int:
    """Bytes one rank sends for a collective over `group_size` ranks on a tensor of `full_bytes`."""
    if group_size <= 1:
        return 0
    if kind == "all_reduce":
        return 2 * full_bytes * (group_size - 1) // group_size
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return full_bytes * (group_size - 1) // group_size
    if kind == "broadcast":
        return full_bytes if is_source else 0
    raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVE_KINDS)}")


def all_to_all_bytes_sent(input_split_sizes: list[int], group_rank: int, row_bytes: int) -> int:
    return (sum(input_split_sizes) - input_split_sizes[group_rank]) * row_bytes


class CommStats:
    """Bytes sent by this rank since the last snapshot, per group and kind."""

    def __init__(self) -> None:
        self._bytes = self._zeros()

    @staticmethod
    def _zeros() -> dict[str, dict[str, int]]:
        return {group: {kind: 0 for kind in kinds} for group, kinds in GROUP_KINDS.items() if group not in ON_FIRST_USE}

    def add(self, group_name: str, kind: str, num_bytes: int) -> None:
        if group_name not in self._bytes and group_name in EXPERT_GROUP_KINDS:
            self._bytes[group_name] = {kind: 0 for kind in EXPERT_GROUP_KINDS[group_name]}
        if group_name in ON_FIRST_USE and group_name not in self._bytes:
            self._bytes[group_name] = {kind: 0 for kind in GROUP_KINDS[group_name]}
        if group_name not in self._bytes:
            raise ValueError(f"unknown group name {group_name!r}; expected one of "
                             f"{', '.join(GROUP_NAMES + tuple(EXPERT_GROUP_KINDS))}")
        if kind not in self._bytes[group_name]:
            kinds = {**GROUP_KINDS, **EXPERT_GROUP_KINDS}[group_name]
            raise ValueError(f"unknown kind {kind!r} on the {group_name} group; expected one of {', '.join(kinds)}")
        self._bytes[group_name][kind] += int(num_bytes)

    def add_counts(self, counts: dict[str, dict[str, int]], times: int = 1) -> None:
        """Add `times` x each count of a snapshot: collectives that ran once and stand for more."""
        for group, kinds in counts.items():
            for kind, num_bytes in kinds.items():
                if num_bytes * times:
                    self.add(group, kind, num_bytes * times)

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {group: dict(kinds) for group, kinds in self._bytes.items()}

    def snapshot_and_reset(self) -> dict[str, dict[str, int]]:
        snapshot, self._bytes = self._bytes, self._zeros()
        for group in snapshot.keys() - self._bytes.keys():
            self._bytes[group] = {kind: 0 for kind in snapshot[group]}
        return snapshot

    def total(self) -> int:
        """Bytes sent (counting receives too would count each byte twice)."""
        return sum(n for kinds in self._bytes.values() for kind, n in kinds.items() if kind != "recv")


class CompletedWork:
    """What a skipped collective returns: wait() returns at once."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


# gloo copies a reduce-scatter's input while it runs (NCCL works in place): a larger one goes in pieces, so the copy is
# one piece
GLOO_PIECE_BYTES = 16 * 2**20
PIECES_IN_FLIGHT = 2


def gloo_copy_bytes(full_bytes: int) -> int:
    return min(full_bytes, PIECES_IN_FLIGHT * GLOO_PIECE_BYTES)


class _PieceWork:
    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self, timeout=None) -> bool:
        for work in self.works:
            work.wait() if timeout is None else work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def _in_pieces(group, whole: torch.Tensor, shard: torch.Tensor) -> Optional[list[tuple[int, int]]]:
    """Bounds of the shard's pieces where this collective goes in pieces; else None."""
    if _num_bytes(whole) <= GLOO_PIECE_BYTES or whole.dim() != 1 or shard.dim() != 1:
        return None
    if not (whole.is_contiguous() and shard.is_contiguous()) or dist.get_backend(group) != "gloo":
        return None
    step = max(1, GLOO_PIECE_BYTES // (group_size(group) * whole.element_size()))
    return [(lo, min(lo + step, shard.numel())) for lo in range(0, shard.numel(), step)]


def _pieces_done(works: list, async_op: bool):
    work = _PieceWork(works)
    if async_op:
        return work
    work.wait()
    return None


class VirtualGroup:
    """A process group that is only its size and the planned rank's place: a dry run's."""

    def __init__(self, size: int, rank: int = 0) -> None:
        if size < 1:
            raise ValueError(f"a group has at least one rank, got {size}")
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a group of {size}")
        self._size = size
        self._rank = rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"VirtualGroup(size={self._size})"


def group_size(group) -> int:
    if group is None:
        return 1
    if isinstance(group, VirtualGroup):
        return group.size()
    return dist.get_world_size(group)


def group_rank(group) -> int:
    if group is None:
        return 0
    if isinstance(group, VirtualGroup):
        return group.rank()
    return dist.get_rank(group)


def _num_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class Communicator:
    """Issues collectives and counts what this rank sends; one per process. Bytes count when issued."""

    def __init__(self) -> None:
        self.stats = CommStats()
        # where this rank is, for the line a lost peer ends in
        self.last_collective: Optional[tuple[str, str]] = None
        self.iteration: Optional[int] = None
        self.log: Optional[CollectiveLog] = None
        self.publish_failure: Optional[Callable[[BaseException], None]] = None

    @contextlib.contextmanager
    def collective_work(self) -> Iterator[None]:
        """Work the ranks do together around files: an exception on some ranks is published through the rendezvous
        store, so peers blocked in a collective end within seconds."""
        try:
            yield
        except BaseException as error:
            if self.publish_failure is not None and not isinstance(error, QUIET_EXITS):
                self.publish_failure(error)
            raise

    @contextlib.contextmanager
    def counted_apart(self) -> Iterator[CommStats]:
        """Count what the body sends apart from `stats` (a CUDA graph's capture, counted again by each replay)."""
        kept, self.stats = self.stats, CommStats()
        try:
            yield self.stats
        finally:
            self.stats = kept

    def where(self) -> str:
        during = (f"during {self.last_collective[0]} on the {self.last_collective[1]} group"
                  if self.last_collective is not None else "before its first collective")
        at = f"at iteration {self.iteration}" if self.iteration is not None else "before the first iteration"
        return f"{during} {at}"

    def _skip(self, group: Optional[dist.ProcessGroup]) -> bool:
        return group_size(group) == 1

    def _start(self, kind: str, group_name: str, group, num_bytes: int) -> Optional[list]:
        return None if self.log is None else self.log.start(kind, group_name, group, num_bytes)

    def _finish(self, entry: Optional[list], work, async_op: bool):
        if entry is None:
            return work
        if async_op:
            return RecordedWork(work, self.log, entry) if work is not None else work
        self.log.complete(entry)
        return work

    # eager even in a compiled block: the accounting is Python state
    @eager_under_compile
    def all_reduce(self, tensor: torch.Tensor, group: Optional[dist.ProcessGroup], group_name: str,
                   op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, async_op: bool = False):
        if self._skip(group):
            return CompletedWork() if async_op else None
        self.stats.add(group_name, "all_reduce", ring_bytes_sent("all_reduce", _num_bytes(tensor), group_size(group)))
        self.last_collective = ("all_reduce", group_name)
        entry = self._start("all_reduce", group_name, group, _num_bytes(tensor))
        return self._finish(entry, self._transport_all_reduce(tensor, op, group, async_op), async_op)

    @eager_under_compile
    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, group: Optional[dist.ProcessGroup],
                       group_name: str, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, async_op: bool = False):
        """Sum `input` over the group; rank i's `output` gets chunk i of dim 0."""
        size = group_size(group)
        if input.numel() != output.numel() * size:
            raise ValueError(f"reduce_scatter: input has {input.numel()} elements, expected "
                             f"{size} x output ({output.numel()})")
        if size == 1:
            _copy_unless_same(output, input)
            return CompletedWork() if async_op else None
        self.stats.add(group_name, "reduce_scatter", ring_bytes_sent("reduce_scatter", _num_bytes(input), size))
        self.last_collective = ("reduce_scatter", group_name)
        entry = self._start("reduce_scatter", group_name, group, _num_bytes(input))
        return self._finish(entry, self._transport_reduce_scatter(output, input, op, group, async_op), async_op)

    @eager_under_compile
    def all_gather(self, output: torch.Tensor, input: torch.Tensor, group: Optional[dist.ProcessGroup],
                   group_name: str, async_op: bool = False):
        size = group_size(group)
        if output.numel() != input.numel() * size:
            raise ValueError(f"all_gather: output has {output.numel()} elements, expected "
                             f"{size} x input ({input.numel()})")
        if size == 1:
            _copy_unless_same(output, input)
            return CompletedWork() if async_op else None
        self.stats.add(group_name, "all_gather", ring_bytes_sent("all_gather", _num_bytes(output), size))
        self.last_collective = ("all_gather", group_name)
        entry = self._start("all_gather", group_name, group, _num_bytes(output))
        return self._finish(entry, self._transport_all_gather(output, input, group, async_op), async_op)

    @eager_under_compile
    def broadcast(self, tensor: torch.Tensor, src: int, group: Optional[dist.ProcessGroup], group_name: str,
                  async_op: bool = False):
        """Copy `tensor` from global rank `src` to every rank of the group."""
        size = group_size(group)
        if size == 1:
            return CompletedWork() if async_op else None
        is_source = self._global_rank() == src
        self.stats.add(group_name, "broadcast", ring_bytes_sent("broadcast", _num_bytes(tensor), size, is_source))
        self.last_collective = ("broadcast", group_name)
        entry = self._start("broadcast", group_name, group, _num_bytes(tensor))
        return self._finish(entry, self._transport_broadcast(tensor, src, group, async_op), async_op)

    @eager_under_compile
    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                   input_split_sizes: list[int], group: Optional[dist.ProcessGroup], group_name: str,
                   async_op: bool = False):
        """Rank i sends `input_split_sizes[j]` rows to group rank j; counted: the rows that leave."""
        size = group_size(group)
        if len(input_split_sizes) != size or len(output_split_sizes) != size:
            raise ValueError(f"all_to_all: {len(input_split_sizes)} input and {len(output_split_sizes)} output "
                             f"splits for a group of {size}")
        if sum(input_split_sizes) != input.shape[0] or sum(output_split_sizes) != output.shape[0]:
            raise ValueError(f"all_to_all: splits {input_split_sizes} -> {output_split_sizes} do not add up to "
                             f"the {input.shape[0]} input and {output.shape[0]} output rows")
        if size == 1:
            _copy_unless_same(output, input)
            return CompletedWork() if async_op else None
        row_bytes = _num_bytes(input) // input.shape[0] if input.shape[0] else 0
        self.stats.add(group_name, "all_to_all", all_to_all_bytes_sent(input_split_sizes, group_rank(group), row_bytes))
        self.last_collective = ("all_to_all", group_name)
        entry = self._start("all_to_all", group_name, group, _num_bytes(input))
        return self._finish(entry, self._transport_all_to_all(output, input, output_split_sizes, input_split_sizes,
                                                              group, async_op), async_op)

    # ---- point-to-point between pipeline stages (parallel/p2p.py holds the completion rule) ----

    def send(self, tensor: torch.Tensor, peer: int, tag: int, group_name: str = "pp") -> list:
        """Post a send to global rank `peer`; returns the works to wait on."""
        self.stats.add(group_name, "send", _num_bytes(tensor))
        self.last_collective = ("send", group_name)
        return self._recorded_p2p("send", peer, group_name, self._transport_p2p(dist.isend, tensor, peer, tag), tensor)

    def receive(self, tensor: torch.Tensor, peer: int, tag: int, group_name: str = "pp") -> list:
        self.stats.add(group_name, "recv", _num_bytes(tensor))
        self.last_collective = ("recv", group_name)
        return self._recorded_p2p("recv", peer, group_name, self._transport_p2p(dist.irecv, tensor, peer, tag), tensor)

    def _recorded_p2p(self, kind: str, peer: int, group_name: str, works: list, tensor: torch.Tensor) -> list:
        if self.log is None:
            return works
        entry = self.log.start_p2p(kind, peer, group_name, _num_bytes(tensor))
        return [RecordedWork(work, self.log, entry) for work in works]

    # ---- the transport: torch.distributed (a dry run replaces these) ----

    def _transport_p2p(self, operation, tensor, peer, tag) -> list:
        return dist.batch_isend_irecv([dist.P2POp(operation, tensor, peer, tag=tag)])

    def _transport_all_reduce(self, tensor, op, group, async_op):
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)

    def _transport_reduce_scatter(self, output, input, op, group, async_op):
        pieces = _in_pieces(group, input, output)
        if pieces is None:
            return _reduce_scatter_single(output, input, op=op, group=group, async_op=async_op)
        chunks = input.view(group_size(group), output.numel())
        works = []
        for lo, hi in pieces:
            # a rank ahead would otherwise hold every queued piece's copy
            if len(works) >= PIECES_IN_FLIGHT:
                works[-PIECES_IN_FLIGHT].wait()
            works.append(dist.reduce_scatter(output[lo:hi], list(chunks[:, lo:hi].unbind(0)), op=op, group=group,
                                             async_op=True))
        return _pieces_done(works, async_op)

    def _transport_all_gather(self, output, input, group, async_op):
        return _all_gather_single(output, input, group=group, async_op=async_op)

    def _transport_broadcast(self, tensor, src, group, async_op):
        return dist.broadcast(tensor, src=src, group=group, async_op=async_op)

    def _transport_all_to_all(self, output, input, output_split_sizes, input_split_sizes, group, async_op):
        return dist.all_to_all_single(output, input, list(output_split_sizes), list(input_split_sizes),
                                      group=group, async_op=async_op)

    def _global_rank(self) -> int:
        return dist.get_rank()

    def barrier(self, group: Optional[dist.ProcessGroup] = None, group_name: str = "world") -> None:
        """Wait for every rank of `group`; None here is the whole world."""
        if not dist.is_available() or not dist.is_initialized():
            return
        if group is None and dist.get_world_size() == 1:
            return
        if group is not None and group_size(group) == 1:
            return
        self.last_collective = ("barrier", group_name)
        entry = self._start("barrier", group_name, group, 0)
        self._finish(entry, dist.barrier(group=group), async_op=False)


    # ---- control messages: whole-world agreement, not counted ----

    def all_gather_object(self, obj) -> list:
        """Every rank's picklable `obj` in rank order; `[obj]` without a process group."""
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
            return [obj]
        gathered = [None] * dist.get_world_size()
        self.last_collective = ("all_gather_object", "world")
        entry = self._start("all_gather_object", "world", None, 0)
        self._finish(entry, dist.all_gather_object(gathered, obj), async_op=False)
        return gathered

    def any_rank(self, flags: list[bool], device: torch.device) -> list[bool]:
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
            return list(flags)
        tensor = torch.tensor([float(flag) for flag in flags], device=device)
        self.max_over_world(tensor)
        return [bool(value) for value in tensor.tolist()]

    def max_over_world(self, tensor: torch.Tensor) -> None:
        """In place, the element-wise max of `tensor` over the whole world; not counted."""
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
            return
        self.last_collective = ("all_reduce", "world")
        entry = self._start("all_reduce", "world", None, _num_bytes(tensor))
        self._finish(entry, dist.all_reduce(tensor, op=dist.ReduceOp.MAX), async_op=False)


def _copy_unless_same(output: torch.Tensor, input: torch.Tensor) -> None:
    if output.data_ptr() != input.data_ptr():
        output.copy_(input.reshape(output.shape))


class DryRunCommunicator(Communicator):
    """Counts what global rank `rank` of a planned run would send, and sends nothing."""

    def __init__(self, rank: int = 0) -> None:
        super().__init__()
        self.rank = rank
        self.largest_transport_copy = 0
        # called with each copy's bytes as it is issued, so a caller can read what else is live
        self.on_transport_copy: Optional[Callable[[int], None]] = None

    def take_largest_transport_copy(self) -> int:
        largest, self.largest_transport_copy = self.largest_transport_copy, 0
        return largest

    def _copied(self, num_bytes: int) -> None:
        self.largest_transport_copy = max(self.largest_transport_copy, num_bytes)
        if self.on_transport_copy is not None:
            self.on_transport_copy(num_bytes)

    @staticmethod
    def _done(async_op: bool):
        return CompletedWork() if async_op else None

    def _transport_all_reduce(self, tensor, op, group, async_op):
        return self._done(async_op)

    def _transport_reduce_scatter(self, output, input, op, group, async_op):
        self._copied(gloo_copy_bytes(_num_bytes(input)))
        return self._done(async_op)

    def _transport_all_gather(self, output, input, group, async_op):
        self._copied(_num_bytes(output))
        return self._done(async_op)

    def _transport_broadcast(self, tensor, src, group, async_op):
        return self._done(async_op)

    def _transport_all_to_all(self, output, input, output_split_sizes, input_split_sizes, group, async_op):
        return self._done(async_op)

    def _transport_p2p(self, operation, tensor, peer, tag) -> list:
        return [CompletedWork()]

    def _global_rank(self) -> int:
        return self.rank

    def barrier(self, group=None, group_name: str = "world") -> None:
        return None

    def all_gather_object(self, obj) -> list:
        return [obj]

    def any_rank(self, flags: list[bool], device: torch.device) -> list[bool]:
        return list(flags)

    def max_over_world(self, tensor: torch.Tensor) -> None:
        return None
