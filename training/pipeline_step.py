"""The pipeline train step: a rank's slots of the schedule run in order (receive, run the chunk, send on; backward the
same way back), then DataParallelTrainStep's optimizer step. As Megatron-Core's schedules, each micro-batch's loss is
divided by the micro-batch count, the loss scale applies on the last stage, and a sent output's bytes are freed once
sent."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

from data.documents import DocumentMasking, DocumentMasks
from gpt.model import GPTModel
from gpt.stage_layers import activation_shape
from parallel.p2p import ACTIVATION, GRADIENT, PipelineP2P, send_lag
from parallel.pipeline_schedules import Slot, VirtualStages, schedule
from parallel.state import ParallelState
from resilience.rerun_state import RerunStateMachine
from training.cuda_graphs import CudaGraphs
from training.evaluation import split_micro_batch
from training.logged_loss import LoggedLoss
from training.run_settings import RunSettings
from training.step_observer import NO_OBSERVER, StepObserver
from training.train_step import DataParallelTrainStep
from zero.activations import ActivationMonitor
from zero.apply import ZeroParts
from zero.pipeline_grads import PipelineGradients


class PipelineTrainStep(DataParallelTrainStep):
    """The optimizer side is DataParallelTrainStep's; the micro-batches run as the pipeline schedule says."""

    def __init__(self, model: GPTModel, zero: ZeroParts, train_batches: Iterator[dict], settings: RunSettings,
                 state: ParallelState, activations: ActivationMonitor,
                 documents: Optional[DocumentMasking] = None, observer: StepObserver = NO_OBSERVER,
                 rerun: Optional[RerunStateMachine] = None, cuda_graphs: Optional[CudaGraphs] = None,
                 rng=None) -> None:
        # pipeline stages capture nothing: the graphs object only counts iterations
        super().__init__(model, zero, train_batches, settings, state, activations, documents, observer, rerun,
                         cuda_graphs, rng)
        self.chunks = len(model.stage.chunks)
        self.virtual = VirtualStages(state.pipeline_parallel_size, state.pipeline_parallel_rank, self.chunks)
        group = settings.config.parallel.microbatch_group_size_per_virtual_pipeline_stage
        self.p2p = PipelineP2P(state.device, state.comm,
                               send_lag(state.pipeline_parallel_size, group if self.chunks > 1 else None))
        tied = model.word_embeddings if model.shares_word_embedding else None
        self.gradients = PipelineGradients(zero, tied.weight if tied is not None else None, state.embedding_group,
                                           state.pipeline_parallel_group, state.is_first_stage)
        self.dtype = next(model.parameters()).dtype
        self.logged = LoggedLoss(documents, state.device)  # each iteration's; the last stage's _forward adds to it

    def forward_backward(self, accumulation_steps: int, measure_activations: bool) -> LoggedLoss:
        """The rank's slots over the iteration's micro-batches; returns the logged loss's sums, on the device."""
        state, reducer, observer = self.state, self.zero.reducer, self.observer
        # under CP each stage's micro-batch and sends are its CP rank's chunks
        group = self.settings.config.parallel.microbatch_group_size_per_virtual_pipeline_stage
        micro_batches = observer.pipeline_micro_batches(accumulation_steps, state.pipeline_parallel_size,
                                                        state.pipeline_parallel_rank, self.chunks, group)
        batches = [split_micro_batch(next(self.train_batches), state.device, self.documents, state)
                   for _ in range(micro_batches)]
        self.iteration_token_scale = None
        if self.settings.config.training.calculate_per_token_loss:  # every stage reads the micro-batches
            self.use_token_scale(batches)
        slots = schedule(micro_batches, state.pipeline_parallel_size, state.pipeline_parallel_rank, self.chunks, group)
        observer.schedule(slots)
        last_backward = max(index for index, slot in enumerate(slots) if slot.kind == "B")
        inputs: dict[tuple[int, int], Optional[torch.Tensor]] = {}
        outputs: dict[tuple[int, int], Union[torch.Tensor, SentOutput]] = {}
        self.logged = LoggedLoss(self.documents, state.device)
        for index, slot in enumerate(slots):
            observer.slot_start(index, slot)
            self.p2p.start_slot()
            tokens, labels, masks = batches[slot.micro_batch]
            if slot.kind == "F":
                with self.activations.measuring() if measure_activations else contextlib.nullcontext():
                    output = self._forward(slot, tokens, labels, inputs, accumulation_steps, masks)
                outputs[(slot.micro_batch, slot.chunk)] = output
                if self._ends_model(slot):  # the last stage validates, as Megatron's loss_func runs there
                    self.loss_checks.keep(output, accumulation_steps)
            else:
                with contextlib.nullcontext() if index == last_backward else reducer.no_sync():
                    self._backward(slot, inputs.pop((slot.micro_batch, slot.chunk)),
                                   outputs.pop((slot.micro_batch, slot.chunk)))
                reducer.finish_grad_sync()
            observer.slot_end(index, slot)
        self.p2p.finish_sends()
        observer.passes_end()
        self.gradients.sum_shared_embedding()
        # the loss lives on the last stage; the others record it too
        state.comm.broadcast(self.logged.sums, state.stage_rank(-1), state.pipeline_parallel_group, "pp")
        return self.logged

    def _virtual_stage(self, slot: Slot) -> int:
        return self.virtual.of(slot.chunk)

    def _starts_model(self, slot: Slot) -> bool:
        return self.virtual.starts_model(slot.chunk)

    def _ends_model(self, slot: Slot) -> bool:
        return self.virtual.ends_model(slot.chunk)

    def _forward(self, slot: Slot, tokens: torch.Tensor, labels: torch.Tensor, inputs: dict,
                 accumulation_steps: int, masks: Optional[DocumentMasks] = None) -> Union[torch.Tensor, "SentOutput"]:
        if self._starts_model(slot):
            received, chunk_input = None, tokens
        else:
            shape = activation_shape(tokens, self.settings.config.model.hidden_size, self.model,
                                     self.state.tensor_parallel_size)
            received = self.p2p.receive(shape, self.dtype, self.state.stage_rank(self._virtual_stage(slot) - 1),
                                        ACTIVATION).requires_grad_()
            chunk_input = received
        inputs[(slot.micro_batch, slot.chunk)] = received
        with self.observer.phase("forward"):
            if self._ends_model(slot):
                losses = self.model.chunk_forward(slot.chunk, chunk_input, labels, tokens=tokens) if masks is None \
                    else self.model.chunk_forward(slot.chunk, chunk_input, labels, masks, tokens=tokens)
                loss = self.micro_batch_loss(losses, masks, accumulation_steps)
                self.logged.add(losses, masks, loss)
                return loss
            output = self.model.chunk_forward(slot.chunk, chunk_input) if masks is None else \
                self.model.chunk_forward(slot.chunk, chunk_input, None, masks)
        self.p2p.send(output, self.state.stage_rank(self._virtual_stage(slot) + 1), ACTIVATION)
        return SentOutput(get_gradient_edge(output), output.shape, output.dtype)

    def _backward(self, slot: Slot, received: Optional[torch.Tensor],
                  output: Union[torch.Tensor, SentOutput]) -> None:
        if self._ends_model(slot):
            with self.observer.phase("backward"):
                self.zero.scale_loss(output).backward()
        else:
            grad = self.p2p.receive(output.shape, output.dtype,
                                    self.state.stage_rank(self._virtual_stage(slot) + 1), GRADIENT)
            with self.observer.phase("backward"):
                torch.autograd.backward(output.edge, grad_tensors=grad)
        if received is not None:
            self.p2p.send(received.grad, self.state.stage_rank(self._virtual_stage(slot) - 1), GRADIENT)


@dataclass(frozen=True)
class SentOutput:
    """A forward's output once sent on: its gradient edge, shape and dtype."""
    edge: GradientEdge
    shape: torch.Size
    dtype: torch.dtype


class PipelineForward:
    """Forward only through the stages, one micro-batch at a time (evaluation): the per-token loss on the last stage."""

    def __init__(self, model: GPTModel, state: ParallelState, hidden_size: int) -> None:
        self.model, self.state, self.hidden_size = model, state, hidden_size
        self.p2p = PipelineP2P(state.device, state.comm)
        self.chunks = len(model.stage.chunks)
        self.dtype = next(model.parameters()).dtype

    def __call__(self, tokens: torch.Tensor, labels: torch.Tensor,
                 documents: Optional[DocumentMasks] = None) -> torch.Tensor:
        state = self.state
        stages = VirtualStages(state.pipeline_parallel_size, state.pipeline_parallel_rank, self.chunks)
        last = stages.last
        loss = torch.zeros((), device=state.device)
        for chunk in range(self.chunks):
            virtual = stages.of(chunk)
            shape = activation_shape(tokens, self.hidden_size, self.model, state.tensor_parallel_size)
            chunk_input = tokens if virtual == 0 else self.p2p.receive(shape, self.dtype,
                                                                       state.stage_rank(virtual - 1), ACTIVATION)
            output = self.model.chunk_forward(chunk, chunk_input, labels if virtual == last else None, documents)
            if virtual == last:
                loss = output
            else:
                self.p2p.send(output, state.stage_rank(virtual + 1), ACTIVATION)
        self.p2p.finish_sends()
        return loss
