"""Memory after a run's first iteration: with --report-memory, each rank's model-state and saved-for-backward bytes
beside zero/memory.py's predictions (with pipeline stages, over the forwards the schedule keeps in flight); always, the
planner's predicted peak beside the measured one."""

from __future__ import annotations

from typing import Optional

import torch

from parallel.pipeline_schedules import peak_held_by_forwards, schedule
from parallel.state import ParallelState
from training.build import pipeline_stage
from training.metrics import MemoryCheck, MetricsWriter
from training.run_settings import RunSettings
from zero.activations import ActivationMonitor, SavedTensorMeter
from zero.memory import (
    format_bytes,
    format_memory_line,
    host_resident_tensors,
    measure_by_placement,
    measure_tensor_bytes,
    memory_record,
    predict_model_state_bytes,
    predict_saved_activation_bytes,
)
from zero.optimizer import PRECISION_DTYPES, ShardedAdamW


class FirstIterationMemory:
    """Reports once, after the first iteration (the Adam moments exist by then)."""

    def __init__(self, optimizer: ShardedAdamW, settings: RunSettings, state: ParallelState, writer: MetricsWriter,
                 activations: ActivationMonitor, memory_check: Optional[MemoryCheck], first_iteration: int,
                 micro_batches: Optional[int] = None) -> None:
        self.optimizer, self.settings, self.state, self.writer = optimizer, settings, state, writer
        self.activations, self.memory_check, self.first_iteration = activations, memory_check, first_iteration
        # the first iteration's micro-batches (a batch ramp may start lower)
        self.micro_batches = micro_batches if micro_batches is not None else settings.batch.final_accumulation_steps

    def measures_activations(self, iteration: int) -> bool:
        """Whether this iteration measures what autograd keeps for backward (--report-memory)."""
        return iteration == self.first_iteration and self.settings.config.logging.report_memory

    def after(self, iteration: int) -> None:
        meter = self.activations.finish_measurement() if self.measures_activations(iteration) else None
        if meter is not None:
            report_memory(self.optimizer, self.settings, self.state, self.writer, iteration, meter,
                          self.micro_batches)
        if self.memory_check is not None and iteration == self.first_iteration:
            # Every rank's figures (ranks differ), one message once per run.
            figures = self.state.comm.all_gather_object(self.memory_check.figures())
            if self.state.is_first_rank:
                print(self.memory_check.line(iteration, figures), flush=True)


def report_memory(optimizer: ShardedAdamW, settings: RunSettings, state: ParallelState,
                  writer: MetricsWriter, iteration: int, meter: SavedTensorMeter, micro_batches: int) -> list[dict]:
    """Measure each rank's model-state and saved-for-backward bytes beside the predictions; rank 0 prints and records
    them."""
    config = settings.config
    measured = measure_tensor_bytes(optimizer.model_state_tensors())
    # cut over DP, or over this rank's optimizer instance
    predicted = predict_model_state_bytes(optimizer.num_parameters, optimizer.stage, state.partition_size,
                                          config.training.precision, config.training.gradient_precision,
                                          config.optimizer.optimizer,
                                          (config.optimizer.algorithms.exp_avg_dtype,
                                           config.optimizer.algorithms.exp_avg_sq_dtype))
    extra = {"iteration": iteration, "stage": optimizer.stage, "data_parallel_size": state.data_parallel_size,
             "partition_size": state.partition_size,
             "tensor_parallel_rank": state.tensor_parallel_rank, "num_parameters": optimizer.num_parameters,
             "padding_elements": optimizer.padding}
    # With offload, what of the states lives in host memory.
    placed = measure_by_placement(optimizer.model_state_tensors(), host_resident_tensors(optimizer))
    extra["host_model_state_bytes"] = placed["host"]["total"]
    extra["host_buffers_bytes"] = placed["host"]["buffers"]
    own = memory_record(measured, predicted, state.rank, extra)
    own.update(saved_activation_record(meter, settings, state, micro_batches))
    records = [own]
    if torch.distributed.is_initialized() and state.world_size > 1:
        records = [None] * state.world_size
        torch.distributed.all_gather_object(records, own)
    if state.is_first_rank:
        for record in records:
            print(" " + format_memory_line(record) + format_activation_line(record), flush=True)
        writer.write({"iteration": iteration, "memory": records}, None)
    return records


def saved_activation_record(meter: SavedTensorMeter, settings: RunSettings, state: ParallelState,
                            micro_batches: int) -> dict:
    """Peak saved-for-backward bytes by location, the checkpointed inputs among them, and their prediction."""
    config = settings.config
    model, activations = config.model, config.activations
    element = torch.finfo(PRECISION_DTYPES[config.training.precision]).bits // 8

    def checkpointed_inputs(num_layers: int) -> int:
        return predict_saved_activation_bytes(
            num_layers, model.seq_length, config.training.micro_batch_size, model.hidden_size,
            model.num_attention_heads, element, state.tensor_parallel_size,
            activations.checkpoint_num_layers if activations.checkpoint_activations else None,
            activations.partition_activations, recompute_method=activations.recompute_method)["checkpointed_inputs"]

    stage = pipeline_stage(settings, state)
    pipeline: dict = {}
    if stage is None:
        predicted = checkpointed_inputs(model.num_layers)
    else:
        slots = schedule(micro_batches, state.pipeline_parallel_size, state.pipeline_parallel_rank,
                         len(stage.chunks), config.parallel.microbatch_group_size_per_virtual_pipeline_stage)
        predicted = peak_held_by_forwards(slots, [checkpointed_inputs(len(chunk)) for chunk in stage.chunks])
        pipeline = {"pipeline_parallel_rank": state.pipeline_parallel_rank,
                    "pipeline_parallel_size": state.pipeline_parallel_size,
                    "stage_layers": len(stage.layer_ids), "stage_chunks": len(stage.chunks),
                    "chunk_forwards_in_flight": peak_held_by_forwards(slots, [1] * len(stage.chunks))}
    cuda = {"cuda_max_memory_allocated_bytes": torch.cuda.max_memory_allocated(state.device)} \
        if state.device.type == "cuda" else {}
    return {**cuda, **pipeline, "saved_activation_device_bytes": meter.peak["device"],
            "saved_activation_host_bytes": meter.peak["host"],
            "checkpointed_input_device_bytes": meter.checkpointed_peak["device"],
            "checkpointed_input_host_bytes": meter.checkpointed_peak["host"],
            "predicted_checkpointed_input_bytes": predicted}


def format_activation_line(record: dict) -> str:
    stage = ""
    if "pipeline_parallel_rank" in record:
        chunks = f" in {record['stage_chunks']} chunks" if record["stage_chunks"] > 1 else ""
        stage = (f" on stage {record['pipeline_parallel_rank']} of {record['pipeline_parallel_size']} "
                 f"({record['stage_layers']} layer{'s' if record['stage_layers'] != 1 else ''}{chunks}, at most {record['chunk_forwards_in_flight']} "
                 f"chunk forwards awaiting their backward)")
    return (f"; saved for backward{stage}: {format_bytes(record['saved_activation_device_bytes'])} device, "
            f"{format_bytes(record['saved_activation_host_bytes'])} host (checkpointed inputs "
            f"{format_bytes(record['checkpointed_input_device_bytes'] + record['checkpointed_input_host_bytes'])}, "
            f"predicted {format_bytes(record['predicted_checkpointed_input_bytes'])})")
