"""--async-save: a checkpoint written by one background thread per rank while training goes on, committed (by the same
`finish_save` a synchronous save ends with) once one small all-reduce says every rank's files are in. A thread, not
Megatron-LM's process: safetensors, fsync and xxHash release the GIL, and a thread dies with its rank.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import nn

from arguments.checkpoint_config import CheckpointConfig
from checkpoint.lineage import RunIdentity
from checkpoint.ours.sharded import RankOutcome, SaveInProgress, begin_save, finish_save, rank_files
from checkpoint.writer import StagedFile, write_files
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer

WRITER_THREAD_NAME = "checkpoint-writer"
MAX_NICE = 19
# How long an error's exit waits for the file being written.
ABANDON_WAIT_S = 30.0
IO_CLASS_NAMES = {0: "none", 1: "real time", 2: "best effort", 3: "idle"}
# A bound on the RNG files' tensors, for the planner.
RNG_STATE_BYTES = 16 << 10


def saving_mode_line(checkpoint: CheckpointConfig, writer_note: str = "", device_type: str = "cpu") -> str:
    """The start-up line that says how this run saves."""
    if checkpoint.saves_in_background:
        return (f"> checkpoints: saved in the background (--async-save): at a save each rank copies its files to "
                f"host memory and training goes on while its writer thread ({writer_note}) writes and hashes them; "
                f"metadata.json, 'latest' and latest_checkpointed_iteration.txt are written once every rank's files "
                f"are in, and the next save, the end of the run and an early exit wait for that"
                + ("" if device_type == "cuda" or None not in (checkpoint.async_ckpt_cpu_priority,
                                                               checkpoint.async_ckpt_io_priority)
                   else "; Megatron-LM's nice 10 and idle I/O class for its writer apply on CUDA (or with "
                        "--async-ckpt-cpu-priority, --async-ckpt-io-priority): on a CPU the training is the CPU's work"))
    if checkpoint.async_save:
        return ("> checkpoints: saved synchronously: --async-save without --use-persistent-ckpt-worker is turned off, "
                "as Megatron-LM turns it off (validate_args: \"not supported without --use-persistent-ckpt-worker\"); "
                "add --use-persistent-ckpt-worker to save in the background")
    return ("> checkpoints: saved synchronously, training waits for each save (--async-save "
            "--use-persistent-ckpt-worker writes them in the background)")


def staged_bytes_bound(parameter_elements: int, parameter_element_bytes: int, partition_bytes: int) -> int:
    """At most what a rank stages at a background save: its parameters in the training dtype, its optimizer partition
    and the RNG states (the planner gives it its meta model's counts)."""
    return parameter_elements * parameter_element_bytes + partition_bytes + RNG_STATE_BYTES


class StagingBuffers:
    """Host copies of the optimizer partition, kept from one save to the next (a save waits for the previous one's
    writes, so reusing faulted-in memory is safe and ~3x faster); pinned on CUDA."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], torch.Tensor] = {}

    def stage(self, file: str, name: str, tensor: torch.Tensor, live: bool) -> torch.Tensor:
        """A contiguous host tensor this save owns: a live one copied into its buffer, a host copy as it is."""
        tensor = tensor.detach()
        if not live and tensor.device.type == "cpu":
            return tensor.contiguous()
        buffer = self._buffers.get((file, name))
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
            if live:
                self._buffers[(file, name)] = buffer
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        return buffer

    def release(self) -> None:
        self._buffers.clear()


def live_storages(progress: SaveInProgress, model: nn.Module) -> set[int]:
    """The storages training changes at its next step (partition and parameters): a staged tensor in one is copied."""
    live = list(progress.shard.tensors.values()) + list(model.parameters())
    return {tensor.untyped_storage().data_ptr() for tensor in live}


@dataclass
class WriteJob:
    """One rank's part of one save: the files staged for the writer, and how their writing went."""
    progress: SaveInProgress
    files: list[StagedFile] = field(default_factory=list)
    outcome: RankOutcome = field(default_factory=RankOutcome)
    staged_bytes: int = 0
    write_seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    abandoned: threading.Event = field(default_factory=threading.Event)

    def _take(self) -> Iterator[StagedFile]:
        """The staged files, each let go once the writer has it; stops an abandoned save between two files."""
        while self.files:
            if self.abandoned.is_set():
                raise InterruptedError("the save was abandoned")
            yield self.files.pop(0)

    def run(self) -> None:
        """On the writer thread: each file and its hash, through the synchronous writer."""
        started = time.perf_counter()
        try:
            if self.outcome.error is None:
                self.outcome.sizes, self.outcome.hashes, self.outcome.listings = write_files(self.progress.staging,
                                                                                             self._take())
        except Exception as failure:  # noqa: BLE001 - disk full, permissions, safetensors' own errors: reported by
            # every rank at the commit, as a synchronous save reports them
            self.outcome.error = f"{type(failure).__name__}: {failure}"
        finally:
            self.files = []
            self.write_seconds = time.perf_counter() - started
            self.done.set()


class BackgroundWriter:
    """One writer thread per rank, one job at a time, at Megatron-LM's priorities for its checkpoint worker; started at
    once so the start-up line can say which priorities it got."""

    def __init__(self, cpu_priority: Optional[int], io_priority: Optional[int]) -> None:
        self._jobs: queue.Queue[Optional[WriteJob]] = queue.Queue()
        self._ready = threading.Event()
        self.note = ""
        self._thread = threading.Thread(target=self._serve, args=(cpu_priority, io_priority), name=WRITER_THREAD_NAME,
                                        daemon=True)  # daemon: an exit that could not wait for it is never held up
        self._thread.start()
        self._ready.wait()

    def _serve(self, cpu_priority: Optional[int], io_priority: Optional[int]) -> None:
        self.note = _lower_priority_of_this_thread(cpu_priority, io_priority)
        self._ready.set()
        while (job := self._jobs.get()) is not None:
            job.run()

    def submit(self, job: WriteJob) -> None:
        self._jobs.put(job)

    def close(self, timeout: Optional[float] = None) -> None:
        """Stop the thread once its current job is done (within `timeout` seconds, else leave it)."""
        self._jobs.put(None)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def writer_priorities(checkpoint: CheckpointConfig, device_type: str) -> tuple[Optional[int], Optional[int]]:
    """(nice value, I/O class) for the writer: as given, else Megatron-LM's (10, 3) on CUDA; None on a CPU, where a
    niced writer starves beside the training and every next save waits for it."""
    default_cpu, default_io = (10, 3) if device_type == "cuda" else (None, None)
    cpu, io = checkpoint.async_ckpt_cpu_priority, checkpoint.async_ckpt_io_priority
    return (default_cpu if cpu is None else cpu), (default_io if io is None else io)


def _lower_priority_of_this_thread(cpu_priority: Optional[int], io_priority: Optional[int]) -> str:
    """Megatron-LM's _set_process_qos for this thread: raise its nice value (never lower it) and set its I/O class with
    `ionice -c`; returns what it got, in words (failures are named, never fatal)."""
    thread = threading.get_native_id()
    words = []
    if cpu_priority is None:
        words.append("the training's CPU priority")
    else:
        try:
            current, target = os.getpriority(os.PRIO_PROCESS, thread), min(cpu_priority, MAX_NICE)
            if current < target:
                os.setpriority(os.PRIO_PROCESS, thread, target)
            words.append(f"nice {max(current, target)}")
        except (OSError, AttributeError) as error:
            words.append(f"nice unchanged: {error}")
    if io_priority is None:
        words.append("its I/O priority")
    else:
        try:
            subprocess.run(["ionice", "-c", str(io_priority), "-p", str(thread)], check=True, capture_output=True,
                           timeout=10)
            words.append(f"I/O class {io_priority}, {IO_CLASS_NAMES.get(io_priority, '?')}")
        except (OSError, subprocess.SubprocessError) as error:
            stderr = getattr(error, "stderr", b"") or b""
            words.append(f"I/O class unchanged: ionice -c {io_priority} failed"
                         + (f" ({stderr.decode(errors='replace').strip()})" if stderr else f" ({error})"))
    return ", ".join(words)


class AsyncCheckpointSaver:
    """Background saves for one run on one rank; every rank makes the same calls at the same iterations."""

    def __init__(self, state: ParallelState, cpu_priority: Optional[int] = None,
                 io_priority: Optional[int] = None) -> None:
        self.state = state
        self.writer = BackgroundWriter(cpu_priority, io_priority)
        self.buffers = StagingBuffers()
        self.pending: Optional[WriteJob] = None

    def save(self, save_dir: str | Path, iteration: int, consumed_samples: int, model: nn.Module,
             optimizer: CheckpointableOptimizer, rng: Optional[TensorParallelRNG], config, tokenizer=None,
             lr: Optional[float] = None, identity: Optional[RunIdentity] = None,
             schedule_samples: Optional[int] = None, rerun_state: Optional[dict] = None,
             tokenizer_record: Optional[dict] = None) -> Optional[Path]:
        """Begin iteration `iteration`'s save (after committing the previous one), stage this rank's files and hand them
        to the writer; returns the previous checkpoint if this call committed it. Raises `CheckpointError` on every rank
        on failure."""
        started = time.perf_counter()
        previous = self.pending.progress.iteration if self.pending is not None else None
        still_writing = self.pending is not None and not self.pending.done.is_set()
        committed = self.wait(f"before the save of iteration {iteration}")
        waited = time.perf_counter() - started
        progress = begin_save(save_dir, iteration, consumed_samples, model, optimizer, config, self.state,
                              tokenizer is not None, lr, identity, schedule_samples, rerun_state, tokenizer_record)
        job, live = WriteJob(progress), live_storages(progress, model)
        staging_started, from_device = time.perf_counter(), False
        try:
            for file in rank_files(progress, model, optimizer, rng, self.state, tokenizer):
                if job.outcome.error is None:  # after a failure the rest is still gathered: the others take part
                    try:
                        from_device |= any(tensor.is_cuda for tensor in file.tensors.values())
                        file.tensors = {name: self.buffers.stage(file.name, name, tensor,
                                                                 tensor.untyped_storage().data_ptr() in live)
                                        for name, tensor in file.tensors.items()}
                        job.files.append(file)
                        job.staged_bytes += file.nbytes
                    except Exception as failure:  # noqa: BLE001 - host memory exhausted, ...: reported at the commit
                        job.outcome.error = f"{type(failure).__name__}: {failure}"
                del file
            if from_device:
                torch.cuda.synchronize()  # the copies from the device are done before training changes it
        except Exception as failure:  # noqa: BLE001 - as above
            job.outcome.error = job.outcome.error or f"{type(failure).__name__}: {failure}"
        staged = time.perf_counter() - staging_started
        self.pending = job
        self.writer.submit(job)
        if self.state.is_first_rank:
            wait = (f", {waited:.1f} s of it for the save of iteration {previous} to finish writing (a longer "
                    f"--save-interval avoids that)" if still_writing else "")
            print(f" staged checkpoint at iteration {iteration}: {job.staged_bytes / 2**20:.1f} MiB copied to host "
                  f"memory in {staged:.1f} s; training blocked {time.perf_counter() - started:.1f} s{wait}; writing "
                  f"in the background", flush=True)
        return committed

    def poll(self, iteration: Optional[int] = None) -> Optional[Path]:
        """Commit the pending save when every rank's writer is done (one small all-reduce while one is pending); returns
        the checkpoint committed, or None."""
        if self.pending is None:
            return None
        if self.state.comm.any_rank([not self.pending.done.is_set()], self.state.device)[0]:
            return None
        return self._commit(f"before iteration {iteration}" if iteration is not None else "")

    def wait(self, when: str = "at the end of training") -> Optional[Path]:
        """Wait for this rank's writer, then commit the pending save with the others; every rank calls it."""
        if self.pending is None:
            return None
        self.pending.done.wait()
        return self._commit(when)

    def _commit(self, when: str) -> Path:
        job, self.pending = self.pending, None
        final = finish_save(job.progress, job.outcome, self.state)
        if self.state.is_first_rank:
            print(f" saved checkpoint {final} ({job.progress.total_bytes / 2**20:.1f} MiB; written in the background "
                  f"in {job.write_seconds:.1f} s, committed {when}, {time.perf_counter() - job.progress.started:.1f} s "
                  f"after the save began)", flush=True)
        return final

    def abandon(self) -> None:
        """On an error (no collective: another rank may be gone): commit nothing, stop the writer after its file, free
        what was staged."""
        job, self.pending = self.pending, None
        if job is not None:
            job.abandoned.set()
        self.writer.close(timeout=ABANDON_WAIT_S)
        self.buffers.release()

    def close(self) -> None:
        """After the last save was waited for: end the writer thread and free the buffers."""
        self.writer.close()
        self.buffers.release()
