"""A training run resolved once, in order, into the `Run` the loop is handed: threads, claimed outputs, tokenizer,
settings, data, model, loaded checkpoint, start-up lines and metrics writers. `Run.close` releases what it made, as does
`prepare` when a step fails half way."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

from arguments.batch_schedule import BatchSchedule
from arguments.checkpoint_config import CheckpointConfig, sample_order, sample_order_kept_note
from arguments.config import PretrainConfig
from checkpoint.formats import initialize_from_pretrained
from checkpoint.global_load import ResumePoint
from checkpoint.null_tokenizer_reading import read_as_saved
from checkpoint.run_saves import CheckpointSaves
from checkpoint.run_start import RunStart, claim_run_start
from checkpoint.tokenizer_check import check_resume_tokenizer
from checkpoint.upcycling import UPCYCLED_ITERATION, load_upcycled
from data.tokenizer import RunTokenizer
from gpt.model_config import ModelConfig
from parallel.launch_environment import read_launch_environment
from parallel.state import ParallelState
from resilience.rerun_resume import resume_machine
from resilience.rerun_setup import rerun_mode_line, rerun_state_machine_for
from resilience.rerun_state import RerunStateMachine
from training.build import Built, build
from training.data_splits import (
    DataSplits,
    KeptAcrossRestarts,
    build_data,
    corpus_cache_dir,
    load_tokenizer_and_data_sources,
    sharded_cyclic_resize_note,
)
from training.exit_conditions import ExitConditions
from training.metrics import MemoryCheck, MetricsWriter
from training.run_description import describe_model
from training.run_outputs import checkpoint_saver, open_metrics
from training.run_settings import RunSettings, model_vocabulary, resolve_run_settings
from training.start_checks import Log
from training.threads import set_intra_op_threads

# (config, state, vocabulary, batch) -> (device peak or None, host bytes, why not): the planner's dry run, passed in.
PredictPeak = Callable[[PretrainConfig, ParallelState, int, BatchSchedule], tuple[Optional[int], int, str]]


@dataclass
class Run:
    """Everything the loop needs, made once."""
    settings: RunSettings  # settings.config is the resolved config
    state: ParallelState
    tokenizer: RunTokenizer
    data: DataSplits
    built: Built
    start: ResumePoint  # iteration 0 and no path on a fresh start
    writer: MetricsWriter
    exit_conditions: ExitConditions
    memory_check: MemoryCheck
    save: Optional[CheckpointSaves]
    log: Log
    claimed: RunStart  # the locks of --save and --metrics-file
    rerun: Optional[RerunStateMachine] = None

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.save is not None:  # train_run waited for the last save; only an error's is left
                self.save.abandon()
            self.exit_conditions.close()
            self.writer.close()
        finally:
            self.claimed.release()


def prepare(config: PretrainConfig, state: ParallelState, batch: BatchSchedule, log: Log,
            predict_peak: PredictPeak, kept: Optional[KeptAcrossRestarts] = None) -> Run:
    """`kept`: the tokenizer and data sources an in-process restart's earlier incarnation loaded."""
    # before any of the run's work
    threads = set_intra_op_threads(read_launch_environment().local_world_size)
    with state.comm.collective_work():  # its checks and loads: an error on some ranks only ends every rank
        claimed = claim_run_start(config, state, corpus_cache_dir(config.data), log, batch)
    with contextlib.ExitStack() as on_failure:  # popped on success: the Run owns what was made
        on_failure.callback(claimed.release)
        log("> preparing tokenizer and data")
        tokenizer, data_sources = (kept.tokenizer_and_data_sources(config.data, config.model) if kept is not None
                                   else load_tokenizer_and_data_sources(config.data, config.model))
        # a NullTokenizer read as the checkpoint's run read --vocab-size
        tokenizer, reading_note = read_as_saved(claimed.saved_null_tokenizer, tokenizer, claimed.resume_from,
                                                config.data.null_tokenizer_eod_id)
        if reading_note:
            log(reading_note)
        tokenizer_note = check_resume_tokenizer(claimed.saved_tokenizer, config, tokenizer)  # before the data
        if tokenizer_note:
            log(tokenizer_note)
        vocab_size = model_vocabulary(config.checkpoint, config.data, config.model, config.sources,
                                      tokenizer.vocab_size)  # the tokenizer's, or an --init-from-hf folder's
        settings = resolve_run_settings(config, vocab_size, state.tensor_parallel_size, state.data_parallel_size,
                                        state.device.type, batch=batch, resumed_lr_schedule=claimed.lr_schedule)
        config = settings.config  # from here on, the resolved copy
        for note in settings.notes:  # what resolving changed
            log(note)
        data = build_data(settings, state, data_sources, tokenizer, claimed.identity.sample_order, claimed.data_start)
        log(data.summary)
        resized = sharded_cyclic_resize_note(config.data, claimed.saved_data_parallel_size, state.data_parallel_size)
        if resized:
            log(resized)
        if claimed.identity.sample_order != sample_order(config.checkpoint.ckpt_format):
            log(sample_order_kept_note(claimed.identity.sample_order, config.checkpoint.ckpt_format))
        predicted, predicted_host, why_not = predict_peak(config, state, settings.vocab_size, batch)
        memory_check = MemoryCheck(predicted, state.device, why_not, predicted_host_bytes=predicted_host)  # its baseline: before the model
        # The model, as the dry run builds it; each rank materializes what it owns.
        built = build(settings, state, dropout_rng=True, torch_compile=config.training.compile)
        if built.fp8:
            log(built.fp8)
        if built.gradient_accumulation_fusion:
            log(built.gradient_accumulation_fusion)
        if built.cuda_graphs is not None:
            log(built.cuda_graphs.line)
        # the rerun state machine before the load, which restores its state
        rerun = rerun_state_machine_for(config.training, state, built.rng, log)
        with state.comm.collective_work():
            start = load_weights(config.checkpoint, config.model, config.training.seed, state, built, claimed, log)
        resume_machine(rerun, start.rerun_state, start.rerun_layout_changed, state.rank, log)
        if rerun is not None:
            log(rerun_mode_line(config.training, config.sources.get("rerun_mode")))
        log(describe_model(settings, state, built, threads))
        writer = open_metrics(config, state, claimed.identity, start.iteration, log, claimed.metrics_file)
        on_failure.callback(writer.close)
        save = checkpoint_saver(config, state, built, tokenizer, claimed.identity, batch, rerun)
        if save is not None:
            on_failure.callback(save.abandon)
            log(save.mode_line)
        if config.checkpoint.moe_use_upcycling:  # Megatron-LM saves the upcycled model before training
            save(UPCYCLED_ITERATION, start.consumed_samples, 0.0, start.schedule_samples)
        for line in config.json_differences:  # last, where a user looks for the learning rate the JSON asked for
            log(line)
        run = Run(settings=settings, state=state, tokenizer=tokenizer, data=data, built=built, start=start,
                  writer=writer, memory_check=memory_check,
                  exit_conditions=ExitConditions(config.checkpoint, state, log_interval=config.training.log_interval),
                  save=save, log=log, claimed=claimed, rerun=rerun)
        on_failure.pop_all()
    return run


def load_weights(checkpoint: CheckpointConfig, model: ModelConfig, seed: int, state: ParallelState, built: Built,
                 claimed: RunStart, log: Log) -> ResumePoint:
    """The checkpoint claim_run_start verified, or --init-from-hf's weights on a fresh start."""
    if checkpoint.init_from_hf and claimed.resume_from is None:
        log(f"> initializing from the Hugging Face model in {checkpoint.init_from_hf}")
        initialize_from_pretrained(built.zero.optimizer, built.model, checkpoint.init_from_hf, model, state)
    if claimed.resume_from is None:
        return ResumePoint(0, 0, None)
    if checkpoint.moe_use_upcycling:
        return load_upcycled(claimed.format_name, claimed.resume_from, built.model, built.zero.optimizer, built.rng,
                             state, model, checkpoint, seed, claimed.data_start, log)
    start = claimed.load(built, state, model, load_optimizer=checkpoint.load_optim,
                         load_rng=checkpoint.load_rng, finetune=checkpoint.finetune)
    log(f"> loaded {start.path}: " + (f"resuming after iteration {start.iteration} "
                                      f"({start.consumed_samples} samples consumed)"
                                      if not checkpoint.finetune else "weights only, from iteration 0"))
    return start
