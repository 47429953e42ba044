"""The checkpointing section of the run's settings: where saves go and how often, what a load takes, the exit
conditions and the formats, with its refusal checks; and the sample order a format implies."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from base.errors import ConfigError
from base.options import flag_of_setting, option
from data.gpt_dataset import APPENDABLE_ORDER
from data.megatron_order import MEGATRON_ORDER

# Megatron-LM's --ckpt-format choices (megatron/training/arguments.py), each with what it is
TORCH_DIST = "torch_dist"
CKPT_FORMATS = {TORCH_DIST: "distributed checkpoint", "torch": "legacy per-rank files",
                "torch_dcp": "plain torch.distributed.checkpoint files", "fsdp_dtensor": "Megatron-FSDP DTensor files",
                "zarr": "deprecated zarr files"}
# The orders a run reads its samples in (data/gpt_dataset.py's, data/megatron_order.py's), as a start line names them
SAMPLE_ORDER_NAMES = {APPENDABLE_ORDER: "this project's order", MEGATRON_ORDER: "Megatron-Core's order"}


def sample_order(ckpt_format: Optional[str]) -> str:
    """The order a run reads its samples in: Megatron-Core's where it writes Megatron-LM's checkpoint (--ckpt-format
    torch_dist, Megatron-LM's default), since Megatron-LM continues such a save from its consumed-samples count in
    its own order, and a run continuing Megatron-LM's save names the format it continues; else this project's."""
    return MEGATRON_ORDER if ckpt_format == TORCH_DIST else APPENDABLE_ORDER


def sample_order_kept_note(order: str, ckpt_format: Optional[str]) -> str:
    """The start line of a resume whose checkpoint's sample order is not the one its --ckpt-format starts a run in."""
    line = (f"> data: samples in {SAMPLE_ORDER_NAMES[order]}, the checkpoint's (a resume keeps its order); "
            f"--ckpt-format {ckpt_format or '(left out)'} starts a run in {SAMPLE_ORDER_NAMES[sample_order(ckpt_format)]}")
    if ckpt_format == TORCH_DIST:
        line += ", in which this run's torch_dist saves are continued, here and by Megatron-LM"
    return line


@dataclass(frozen=True)
class CheckpointConfig:
    save: Optional[str] = option(None, metavar="DIR", help="write checkpoints here: one iter_NNNNNNN/ per save and "
                                                           "a 'latest' pointer")
    # None: save only at the end of training and on an exit.
    save_interval: Optional[int] = option(
        None, help="save every N iterations (always also at the end of training and on an exit)",
        aliases={"--persistent-save-interval": "Megatron-LM"})
    keep_last: Optional[int] = option(None, help="keep only the newest K checkpoints")  # None keeps all
    load: Optional[str] = option(
        None, metavar="CKPT",
        help="resume from a --save directory (its latest checkpoint) or one iter_NNNNNNN directory, at any "
             "data-parallel size and ZeRO stage; when it is also the --save directory and holds no checkpoint yet, "
             "the run starts fresh, so restarts can use the same command")
    load_optim: bool = option(True, help="--no-load-optim: take the weights only, with fresh Adam moments")
    load_rng: bool = option(True, help="--no-load-rng: random streams from --seed instead of the checkpoint's")
    # Megatron-LM's flag, which exits 0 there (checkpointing.py load_checkpoint: sys.exit()); here an error, exit 2.
    exit_on_missing_checkpoint: bool = option(False, help="refuse a --load that holds no checkpoint (without it: "
                                                          "a warning, and the run starts from random weights)")
    # Also with a fresh data order.
    finetune: bool = option(False, help="load weights only and start at iteration 0")
    # Megatron-LM's MoE upcycling (checkpoint/upcycling.py; the rules: arguments/upcycling_rules.py)
    moe_use_upcycling: bool = option(
        False, help="--load a dense checkpoint into this MoE model: each MLP copied into every expert, the router "
                    "as built; training starts at iteration 0 with a fresh optimizer and schedule")
    moe_upcycling_granularity: int = option(
        1, help="with --moe-use-upcycling: split each dense MLP into this many fine-grained experts (the dense FFN "
                "is --ffn-hidden-size times this)")
    init_from_hf: Optional[str] = option(None, metavar="DIR", help="start from a transformers GPT2LMHeadModel "
                                                                   "or LlamaForCausalLM folder (config.json + "
                                                                   "model.safetensors)")
    exit_signal_handler: bool = option(False, help="on SIGTERM or SIGUSR1, finish the iteration, save and exit 0")
    exit_interval: Optional[int] = option(None, help="save and exit 0 after an iteration that is a multiple of N "
                                                   "(0: never, as Megatron-LM reads it)")
    exit_duration_in_mins: Optional[float] = option(None, help="save and exit 0 once the run has lasted this many "
                                                               "minutes")
    # BigScience's kill switch.
    kill_switch_path: Optional[str] = option(
        None, flags=("--kill-switch-path", "--kill-switch-file"), metavar="FILE",
        help="when FILE exists: do not start, or save after the current iteration and exit 0 (BigScience's "
             "Megatron-DeepSpeed)")
    # swiss-ai's Megatron-LM fork (megatron/training/training.py, checkpoint_and_decide_exit and train): its
    # job scripts requeue themselves until DIR/exit appears (training/exit_conditions.py).
    trigger_path: Optional[str] = option(
        None, metavar="DIR",
        help="every --log-interval iterations: when DIR/save exists, save and remove it; when DIR/exit exists, save "
             "and exit 0; a run that reaches --train-iters creates DIR/exit (swiss-ai's Megatron-LM fork)")
    # A run that did not resume from --save's checkpoints replaces them only with this.
    overwrite_save: bool = option(
        False, help="let this run write into a --save directory holding checkpoints it did not resume from (its "
                    "saves replace same-numbered iterations and move 'latest')")
    override_data_on_resume: bool = option(
        False, help="resume although --data-path, --split, --seq-length or --seed differ from the checkpoint's (the "
                    "samples then differ from the original run's)")
    # Megatron-DeepSpeed's --universal-checkpoint: its training.py puts {"load_universal": true} in DeepSpeed's
    # checkpoint config, so the engine loads the folder `latest_universal` names (checkpoint/deepspeed/files.py)
    universal_checkpoint: bool = option(
        False, help="--load a DeepSpeed save directory's universal checkpoint (the folder its latest_universal names, "
                    "ds_to_universal's output) instead of the ZeRO checkpoint its latest names")
    verify_checkpoint: bool = option(
        True, help="check every checkpoint file's content hash before loading (--no-verify-checkpoint keeps the "
                   "size, header and dtype checks and skips reading whole files)")
    # Megatron-LM's asynchronous save (megatron/training/config/training_config.py, CheckpointConfig); it saves
    # in the background only with its persistent worker: validate_args turns --async-save off without it, and so
    # does `saves_in_background` (checkpoint/ours/async_save.py).
    async_save: bool = option(
        False, help="write checkpoints in the background while training goes on (with --use-persistent-ckpt-worker, "
                    "as Megatron-LM requires; the commit waits until every rank's files are written)")
    use_persistent_ckpt_worker: bool = option(
        False, help="the background writer --async-save needs: one writer thread per rank, for the whole run")
    # None: Megatron-LM's 10 and 3 on CUDA, where the CPU mostly waits for the device; on a CPU the training is the
    # CPU's work, and a writer at nice 10 got a tenth of a core against it (checkpoint/ours/async_save.py)
    async_ckpt_cpu_priority: Optional[int] = option(
        None, help="the background writer's CPU nice value (0-19, higher yields more to training; raised to it, never "
                   "lowered; default Megatron-LM's 10 on CUDA, the training's own on a CPU)")
    async_ckpt_io_priority: Optional[int] = option(
        None, help="the background writer's I/O scheduling class (ionice -c: 1 real time, 2 best effort, 3 idle; "
                   "default Megatron-LM's 3 on CUDA, the training's own on a CPU)")

    @property
    def saves_in_background(self) -> bool:
        """Whether saves go to the background writer: --save with --async-save and --use-persistent-ckpt-worker
        (Megatron-LM's validate_args: "--async-save is not supported without --use-persistent-ckpt-worker.
        Disabling --async-save.")."""
        return bool(self.save and self.async_save and self.use_persistent_ckpt_worker)

    # Megatron-LM's --ckpt-format. Left out: this project's own format (checkpoint/ours/sharded.py). Megatron-LM's other
    # formats are accepted as Megatron-LM launches give them (its functional tests' --ckpt-format torch) and write
    # this project's format, said at start-up (`unwritten_format_note`): the format changes no math.
    ckpt_format: Optional[str] = option(
        None, choices=CKPT_FORMATS,
        help="torch_dist: --save writes Megatron-LM's distributed checkpoint (iter_NNNNNNN/ with .distcp files and "
             "common.pt), which Megatron-LM --load-s and continues (docs/checkpoints.md); left out or another of "
             "Megatron-LM's formats: this project's own checkpoints. A --load of either is read whatever this says")

    def unwritten_format_note(self) -> Optional[str]:
        """The start line for a --ckpt-format whose files are not written here; None where it is (or unset)."""
        if self.ckpt_format in (None, TORCH_DIST) or not self.save:
            return None
        return (f"> --ckpt-format {self.ckpt_format}: Megatron-LM's {CKPT_FORMATS[self.ckpt_format]} are not "
                f"written here; --save writes this project's checkpoints (--ckpt-format {TORCH_DIST} writes "
                f"Megatron-LM's distributed checkpoint)")

    def validate(self) -> None:
        for name in ("save_interval", "keep_last"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {value}", flags=(_flag(name),))
        # Megatron-LM exits `if args.exit_interval and iteration % args.exit_interval == 0` (training.py), so 0 is
        # no exit; a negative N divides every iteration, so the run would stop after its first
        if self.exit_interval is not None and self.exit_interval < 0:
            raise ConfigError(f"--exit-interval must be 0 (never) or more, got {self.exit_interval}",
                              flags=("--exit-interval",))
        if self.exit_duration_in_mins is not None and not self.exit_duration_in_mins > 0:
            raise ConfigError(f"--exit-duration-in-mins must be positive, got {self.exit_duration_in_mins}",
                              flags=("--exit-duration-in-mins",))
        # --save-interval alone is not here: Megatron-LM saves only `if args.save and args.save_interval`,
        # so without --save it saves nothing (said at start, arguments/parser.py)
        for name in ("keep_last", "exit_signal_handler"):
            if getattr(self, name) and not self.save:
                raise ConfigError(f"{_flag(name)} needs --save DIR (where the checkpoints go)",
                                  flags=(_flag(name), "--save"))
        if self.finetune and not self.load:
            raise ConfigError("--finetune needs --load CHECKPOINT (the weights to start from)",
                              flags=("--finetune", "--load"))
        if self.save and Path(self.save).is_file():
            raise ConfigError(f"--save {self.save} is a file; it must be a directory (created if missing)",
                              flags=("--save",))


def _flag(name: str) -> str:
    return flag_of_setting(CheckpointConfig, name)
