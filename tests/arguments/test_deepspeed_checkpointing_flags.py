"""Issue 34 (round 3): Megatron-DeepSpeed's own activation-checkpointing flags set nothing without
--deepspeed-activation-checkpointing.

The real code:
- Megatron-DeepSpeed (github:deepspeedai/Megatron-DeepSpeed 4efb479d) megatron/initialize.py lines 266-267,
  in _initialize_distributed: `if args.deepspeed and args.deepspeed_activation_checkpointing:
  setup_deepspeed_random_and_activation_checkpointing(args)`, the only reader of args.partition_activations,
  args.contigious_checkpointing, args.checkpoint_in_cpu, args.synchronize_each_layer and args.profile_backward
  (lines 186-194, deepspeed.checkpointing.configure(...)); megatron/model/transformer.py line 1910 calls
  DeepSpeed's checkpoint function under the same condition, Megatron's own otherwise.
- DeepSpeedExamples (github:microsoft/DeepSpeedExamples 89ce0d5a) megatron/Megatron-LM-v1.1.5-3D_parallelism/
  megatron/initialize.py lines 107-119 (configure) and 187-188 (the same condition), and
  megatron/Megatron-LM-v1.1.5-ZeRO3/megatron/initialize.py lines 110-117 and 169-170. The 2020 fork
  (Megatron-LM/pretrain_gpt2.py lines 542-577) has none of these flags: it hands configure the JSON.
"""

from __future__ import annotations

from arguments.parser import parse_arguments
from tests.arguments.test_megatron_launch_defaults import _shrunk

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2", "--checkpoint-activations"]
THEIRS = ["--partition-activations", "--checkpoint-in-cpu", "--contigious-checkpointing", "--synchronize-each-layer"]


def _activations(parsed):
    a = parsed.config.activations
    return (a.checkpoint_activations, a.partition_activations, a.cpu_checkpointing, a.contiguous_checkpointing,
            a.synchronize_checkpoint_boundary)


def _set_nothing(parsed):
    return [note for note in parsed.notes if "set nothing" in note]


def test_their_flags_without_the_switch_set_nothing_and_are_named_in_one_line():
    parsed = parse_arguments([*MODEL, *THEIRS, "--deepspeed"])
    assert _activations(parsed) == (True, False, False, False, False)
    lines = _set_nothing(parsed)
    assert len(lines) == 1 and lines[0].startswith("warning: " + ", ".join(THEIRS) + " set nothing")
    assert "not read without --deepspeed-activation-checkpointing" in \
        parsed.config.sources["partition_activations"].describe()
    switched = parse_arguments([*MODEL, *THEIRS, "--deepspeed", "--deepspeed-activation-checkpointing"])
    assert _activations(switched) == (True, True, True, True, True) and not _set_nothing(switched)


def test_this_programs_own_use_of_the_flags_keeps_them():
    """Without --deepspeed the launch is not Megatron-DeepSpeed's; with --config it is DeepSpeed's own use."""
    assert _activations(parse_arguments([*MODEL, "--partition-activations"]))[1] is True
    named = parse_arguments(["--config", "tiny", *MODEL, "--partition-activations", "--deepspeed"])
    assert _activations(named)[1] is True and not _set_nothing(named)
    # our own spelling is not Megatron-DeepSpeed's flag
    assert _activations(parse_arguments([*MODEL, "--cpu-checkpointing", "--deepspeed"]))[2] is True


def test_the_corpus_v115_launches_resolve_to_what_their_fork_ran(tmp_path):
    """deepspeedexamples-v1.1.5-3d-ds-pretrain-gpt2 (ds_pretrain_gpt2.sh, PA=true CC=true SYNCHRONIZE=true)
    passes --partition-activations --synchronize-each-layer --contigious-checkpointing without
    --deepspeed-activation-checkpointing: the fork checkpoints with Megatron's own function, so none applies;
    the ZeRO3 fork's ds_pretrain_gpt2-zero2.sh passes the switch, so all do."""
    parsed = parse_arguments(_shrunk("deepspeedexamples-v1.1.5-3d-ds-pretrain-gpt2", tmp_path / "3d"))
    assert _activations(parsed) == (True, False, False, False, False) and len(_set_nothing(parsed)) == 1
    parsed = parse_arguments(_shrunk("deepspeedexamples-v1.1.5-zero3-ds-pretrain-gpt2-zero2", tmp_path / "z3"))
    assert _activations(parsed) == (True, True, True, True, True) and not _set_nothing(parsed)
