"""A run that continues a DeepSpeed checkpoint: every file verified, then our own resume checks fed from what the run
recorded (Megatron-DeepSpeed's args and scheduler; a plain DeepSpeed script records none, said once), then the load. A
--save directory holding DeepSpeed's checkpoints is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Optional

from arguments.schedule import LearningRateSchedule, build_lr_schedule, resumed_schedule
from base.errors import CheckpointError, ConfigError
from checkpoint.agreement import agree, attempt
from checkpoint.deepspeed.files import (
    UNIVERSAL_STATES,
    DeepSpeedCheckpoint,
    find_deepspeed_checkpoint,
    holds_deepspeed_checkpoints,
    verify_pt,
)
from checkpoint.deepspeed.source import DeepSpeedSource, open_deepspeed_source
from checkpoint.global_load import ResumePoint, load_from_source
from checkpoint.global_state import SourceProgress
from checkpoint.inside import inside
from checkpoint.resume_checks import agreed_problem
from checkpoint.resume_model import check_resume_model
from checkpoint.start_decision import check_resume_matches, check_samples_fit, continues_training

NORMALIZATION = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


def refuse_save_into_deepspeed(save: Optional[str]) -> None:
    held = holds_deepspeed_checkpoints(Path(save)) if save and Path(save).is_dir() else None
    if held:
        raise ConfigError(f"--save {save} holds DeepSpeed's checkpoints ({held}); saving there would replace its "
                          f"'latest' with this run's pointer: choose another --save directory", flags=("--save",))


def megatron_model_settings(args: argparse.Namespace) -> dict:
    """A Megatron-DeepSpeed run's block settings as our ModelConfig names them; its GeLU is tanh unless
    --no-bias-gelu-fusion or --openai-gelu."""
    settings = {}
    if hasattr(args, "normalization"):
        settings["normalization"] = NORMALIZATION.get(args.normalization, args.normalization)
    if hasattr(args, "swiglu"):
        settings["swiglu"] = bool(args.swiglu)
    if hasattr(args, "num_attention_heads"):
        settings["num_attention_heads"] = args.num_attention_heads
        settings["num_query_groups"] = getattr(args, "num_key_value_heads", None) or args.num_attention_heads
    rotary = getattr(args, "use_rotary_position_embeddings", False)
    settings["position_embedding_type"] = "rope" if rotary else \
        "learned_absolute" if getattr(args, "add_position_embedding", True) else "none"
    for ours, theirs in (("untie_embeddings_and_output_weights", "untie_embeddings_and_output_weights"),
                         ("add_bias_linear", "add_bias_linear"), ("layernorm_epsilon", "layernorm_epsilon"),
                         ("rotary_base", "rope_theta"), ("rotary_percent", "rotary_percent")):
        if hasattr(args, theirs):
            settings[ours] = getattr(args, theirs)
    if not settings.get("swiglu"):
        tanh = getattr(args, "openai_gelu", False) or getattr(args, "bias_gelu_fusion", True)
        settings["activation"] = "squared_relu" if getattr(args, "squared_relu", False) else \
            "gelu_tanh" if tanh else "gelu"
    return settings


def _not_built_here(args: argparse.Namespace) -> list[str]:
    """Megatron-DeepSpeed block options this project does not build (each would change the math)."""
    return [flag for flag, name in (("--apply-residual-connection-post-layernorm",
                                     "apply_residual_connection_post_layernorm"),
                                    ("--apply-layernorm-1p", "apply_layernorm_1p"))
            if getattr(args, name, False)]


def _sample_settings(args: argparse.Namespace) -> dict:
    """The checkpoint's sample-defining settings in our config's shape (checkpoint/start_decision.py)."""
    data = {"split": args.split} if getattr(args, "split", None) is not None else {}
    model = {"seq_length": args.seq_length} if getattr(args, "seq_length", None) is not None else {}
    training = {"seed": args.seed} if getattr(args, "seed", None) is not None else {}
    return {"data": data, "model": model, "training": training}


def megatron_schedule(state: dict) -> LearningRateSchedule:
    """Megatron-DeepSpeed's OptimizerParamScheduler state as a schedule (its warmup starts at 0)."""
    return LearningRateSchedule(max_lr=float(state["max_lr"]), min_lr=float(state["min_lr"]),
                                style=str(state["lr_decay_style"]), warmup_samples=state["lr_warmup_steps"],
                                decay_samples=state["lr_decay_steps"], warmup_tokens=state.get("lr_warmup_tokens"),
                                decay_tokens=state.get("lr_decay_tokens"))


def optimizer_notes(source: DeepSpeedSource, config) -> Optional[str]:
    """One line when the checkpoint's Adam hyperparameters are not this run's (this run's flags set them)."""
    groups = ((source.optimizer_state or {}).get("base_optimizer_state") or {}).get("param_groups") \
        or ((source.optimizer_state or {}).get("optimizer_state_dict") or {}).get("param_groups") \
        or (source.optimizer_state or {}).get("param_groups") or []
    flags = config.optimizer  # this run's optimizer flags (not an optimizer object)
    ours = {"betas": (flags.adam_beta1, flags.adam_beta2), "eps": flags.adam_eps}
    differences = []
    for group in groups[:1]:
        for name, value in ours.items():
            theirs = tuple(group[name]) if isinstance(group.get(name), (list, tuple)) else group.get(name)
            if theirs is not None and theirs != value:
                differences.append(f"{name} {theirs} (this run's: {value})")
    decayed = [g.get("weight_decay") for g in groups if g.get("weight_decay")]
    if decayed and decayed[0] != flags.weight_decay:
        differences.append(f"weight_decay {decayed[0]} (this run's --weight-decay: {flags.weight_decay})")
    if not differences:
        return None
    return (f"> note: {source.path}'s optimizer ran with {', '.join(differences)}; DeepSpeed's own resume would keep "
            f"them, this run uses its flags")


def check_deepspeed_resume(config, batch, checkpoint: DeepSpeedCheckpoint,
                           log: Callable[[str], None]) -> Optional[LearningRateSchedule]:
    """The checks on one rank; returns the checkpoint's schedule when it is kept."""
    with_args = open_deepspeed_source(checkpoint, config.model)
    args, progress, path = with_args.args, with_args.progress(), checkpoint.path
    log(with_args.describe())
    if config.checkpoint.finetune:
        return None
    metadata = _progress_metadata(args, progress)
    trains = continues_training(config)  # False under --skip-train: only the model is checked
    if trains:
        check_samples_fit(metadata, config, batch, path)
    if args is None:
        log(f"> note: {path} is a plain DeepSpeed run's (no Megatron-DeepSpeed args): it records no data, model or "
            f"schedule settings, so this run's are used (its heads, activation and norm epsilon included)")
    else:
        _check_megatron_args(args, config, path, trains, log)
    note = optimizer_notes(with_args, config)
    if note:
        log(note)
    return _kept_schedule(with_args, config, batch, path, trains, log)


def _progress_metadata(args: Optional[argparse.Namespace], progress: SourceProgress) -> dict:
    """Where the checkpoint stopped, in our metadata's shape; without Megatron-DeepSpeed's args the global batch is
    inferred."""
    saved_batch = getattr(args, "global_batch_size", None) if args is not None else None
    if args is None and progress.iteration:
        saved_batch = progress.consumed_samples // progress.iteration if progress.consumed_samples else None
    return {"iteration": progress.iteration, "consumed_samples": progress.consumed_samples or 0,
            "config": {"training": {"global_batch_size": saved_batch}}}


def _check_megatron_args(args: argparse.Namespace, config, path: Path, trains: bool,
                         log: Callable[[str], None]) -> None:
    """What Megatron-DeepSpeed's args record: samples, data paths (a note only) and blocks, refused where they differ.
    """
    note = check_resume_matches({"config": _sample_settings(args)}, config, path,
                                config.checkpoint.override_data_on_resume) if trains else None
    if note:
        log(note)
    typed = [str(p) for p in getattr(args, "data_path", None) or []]
    if typed and typed != [str(p) for p in config.data.data_path or []]:
        log(f"> note: {path} was trained on --data-path {' '.join(typed)}; this run reads "
            f"{' '.join(map(str, config.data.data_path or ['the embedded corpus']))} (Megatron-DeepSpeed records "
            f"the paths only, so their content is not compared)")
    unbuilt = _not_built_here(args)
    if unbuilt:
        raise ConfigError(f"{path} was trained with {', '.join(unbuilt)}, which is not built here: its weights "
                          f"would compute another function")
    check_resume_model({"config": {"model": megatron_model_settings(args)}}, config.model, path)


def _kept_schedule(with_args: DeepSpeedSource, config, batch, path: Path, trains: bool,
                   log: Callable[[str], None]) -> Optional[LearningRateSchedule]:
    """The checkpoint's scheduler compared with this run's by Megatron's rule, when the run trains on with the optimizer
    state."""
    scheduler = with_args.megatron_scheduler()
    if scheduler is None or not config.checkpoint.load_optim or not trains:
        return None
    ours = build_lr_schedule(config.optimizer, config.training, config.model.seq_length, batch)
    schedule, note = resumed_schedule(config.optimizer, config.training, ours, megatron_schedule(scheduler), path)
    if note:
        log(note)
    return schedule


def deepspeed_files(checkpoint: DeepSpeedCheckpoint) -> list[Path]:
    """Every .pt file of the tag folder (a universal one's zero/ too), each checked inside it."""
    folder = checkpoint.path
    files = [inside(folder, p.name) for p in sorted(folder.glob("*.pt"))]
    if checkpoint.universal:
        for directory in sorted((folder / UNIVERSAL_STATES).iterdir()):
            names = [p.name for p in sorted(directory.glob("*.pt"))] if directory.is_dir() else [directory.name]
            files += [inside(folder, UNIVERSAL_STATES, directory.name, *([n] if directory.is_dir() else []))
                      for n in names]
    return [p for p in files if p.suffix == ".pt"]


def verify_deepspeed(checkpoint: DeepSpeedCheckpoint, rank: int, world_size: int, check_content: bool) -> Optional[str]:
    """This rank's share of the files verified: the first problem, or None."""
    try:
        files = deepspeed_files(checkpoint)
    except CheckpointError as error:
        return str(error)
    for path in files[rank::world_size]:
        problem = verify_pt(path, check_content)
        if problem:
            return problem
    return None


def load_deepspeed_checkpoint(checkpoint: DeepSpeedCheckpoint, model, optimizer, rng, state, model_config, *,
                              load_optimizer: bool = True, load_rng: bool = True, finetune: bool = False,
                              log=print) -> ResumePoint:
    """Every rank reads its own regions; one line for what is not carried."""
    source = open_deepspeed_source(checkpoint, model_config)
    not_carried = source.not_carried()
    if not_carried and state.is_first_rank:
        log(f" note: not carried from {checkpoint.path}: {'; '.join(not_carried)}", flush=True)
    return load_from_source(source, model, optimizer, rng, state, load_optimizer=load_optimizer, load_rng=load_rng,
                            finetune=finetune, log=log)


def check_start(config, state, folder: Path, log, batch) -> tuple[Optional[LearningRateSchedule], Optional[dict]]:
    """The format registry's call before any work: files verified by a share of the ranks, then the checks on the first
    rank."""
    checkpoint = find_deepspeed_checkpoint(folder, False)
    agreed_problem(state, verify_deepspeed(checkpoint, state.rank, state.world_size,
                                           config.checkpoint.verify_checkpoint))
    lines: list[str] = []
    schedule, error = attempt(lambda: check_deepspeed_resume(config, batch, checkpoint, lines.append)) \
        if state.is_first_rank else (None, None)
    agree(state, error)
    for line in lines:
        log(line)
    return state.comm.all_gather_object(schedule)[0], None


def load_resume(folder: Path, model, optimizer, rng, state, model_config, *, load_optimizer: bool, load_rng: bool,
                finetune: bool) -> ResumePoint:
    """The format registry's load (checkpoint/formats.py)."""
    return load_deepspeed_checkpoint(find_deepspeed_checkpoint(folder, False), model, optimizer, rng, state,
                                     model_config, load_optimizer=load_optimizer, load_rng=load_rng, finetune=finetune)
