"""The DeepSpeed JSON's `activation_checkpointing` block under a Megatron launch: the real pair reads it only
under --deepspeed-activation-checkpointing, and only in DeepSpeedExamples' 2020 fork; in no generation does
the block turn checkpointing on. Each ignored value that differs from what runs is named in the one "not
read" warning line (arguments/deepspeed/client_objects.py). A preset launch (DeepSpeed used alone) keeps
reading the block, and the block there still implies --checkpoint-activations. The real code:
- Megatron-DeepSpeed 4efb479d megatron/initialize.py 266-267 calls setup_deepspeed_random_and_activation_checkpointing
  only under both flags; its 186-194 pass configure(mpu, deepspeed_config, partition_activations,
  contiguous_checkpointing, num_checkpoints=num_layers, checkpoint_in_cpu, synchronize, profile), each a store_true
  flag (megatron/arguments.py 1524-1535: False, never None).
- DeepSpeed 38327e07 activation_checkpointing/checkpointing.py configure (1029-1103): the block's six keys first
  (_configure_using_config_file, 998-1010), then every argument not None overwrites them, so in Megatron-DeepSpeed
  every key is a flag's. The engine never calls configure itself.
- DeepSpeedExamples 5c6b1c8f: the v1.1.5 forks (Megatron-LM-v1.1.5-ZeRO3/megatron/initialize.py 110-117, 169-170;
  -3D_parallelism 108-115, 187) make the same call with no deepspeed_config; the 2020 fork (Megatron-LM/
  pretrain_gpt2.py 542-544, 576-577) calls configure(mpu, deepspeed_config, num_checkpoints=args.num_layers), so the
  block's keys but number_checkpoints stand (its arguments.py 109-115 has no flag for them).
- Checkpointing itself is --checkpoint-activations in every generation (Megatron-DeepSpeed transformer.py
  ParallelTransformer.forward `if self.checkpoint_activations`); the flag only swaps in DeepSpeed's function (1910)."""

from __future__ import annotations

import json

from arguments.parser import parse_arguments
from arguments.print_config import format_config
from tests.arguments.test_megatron_launch_defaults import _shrunk

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2"]
BLOCK = {"partition_activations": True, "contiguous_memory_optimization": True, "number_checkpoints": 4}


def _json(tmp_path, block: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "activation_checkpointing": block}))
    return str(path)


def _activations(parsed) -> tuple:
    activations = parsed.config.activations
    return (activations.checkpoint_activations, activations.partition_activations,
            activations.contiguous_checkpointing, activations.number_checkpoints)


def _not_read_warnings(parsed) -> list[str]:
    return [note for note in parsed.notes if note.startswith("warning:") and "not read" in note]


def test_without_the_flag_the_block_sets_nothing_and_turns_no_checkpointing_on(tmp_path):
    parsed = parse_arguments([*MODEL, "--deepspeed", "--deepspeed_config", _json(tmp_path, BLOCK)])
    assert _activations(parsed) == (False, False, False, None)  # was (True, True, True, 4)
    warnings = _not_read_warnings(parsed)
    assert len(warnings) == 1, parsed.notes
    assert warnings[0].startswith("warning: 4 value(s) in")
    for named in ("activation_checkpointing.partition_activations (--partition-activations True)",
                  "activation_checkpointing.number_checkpoints (--number-checkpoints 4)",
                  "activation_checkpointing (--checkpoint-activations True) is not read as a switch",
                  "only under --deepspeed-activation-checkpointing"):
        assert named in warnings[0]
    assert warnings[0].count("only under --deepspeed-activation-checkpointing") == 1  # one reason, said once
    assert "not read" in next(line for line in format_config(parsed).splitlines()
                              if line.split()[:1] == ["activation_checkpointing.partition_activations"])


def test_under_megatron_deepspeeds_flag_its_own_flags_overwrite_the_block(tmp_path):
    ds = _json(tmp_path, BLOCK)
    parsed = parse_arguments([*MODEL, "--checkpoint-activations", "--deepspeed-activation-checkpointing",
                              "--deepspeed", "--deepspeed_config", ds])
    assert parsed.megatron_generation == "megatron-deepspeed"
    assert _activations(parsed) == (True, False, False, None)
    warnings = _not_read_warnings(parsed)
    assert len(warnings) == 1 and "which overwrite every key of the block" in warnings[0]
    assert "not read as a switch" not in warnings[0]  # --checkpoint-activations is given: the run checkpoints
    # these flags fit the 2020 fork as well, which would have read the block: the tie rule's choice is named
    assert "fit dse-megatron-lm as well, which read it" in warnings[0]
    # the flag of theirs that the block loses to, given, runs
    parsed = parse_arguments([*MODEL, "--checkpoint-activations", "--deepspeed-activation-checkpointing",
                              "--partition-activations", "--deepspeed", "--deepspeed_config", ds])
    assert _activations(parsed)[:2] == (True, True)


def test_the_2020_forks_flag_hands_the_block_to_deepspeed(tmp_path):
    """DeepSpeedExamples' ds_zero2_pretrain_gpt2_model_parallel.sh passes --checkpoint-activations
    --deepspeed-activation-checkpointing beside a block with partition_activations true."""
    argv = _shrunk("deepspeedexamples-ds-zero2-pretrain-gpt2-model-parallel", tmp_path)
    parsed = parse_arguments(argv)
    assert parsed.megatron_generation == "dse-megatron-lm"
    assert _activations(parsed)[:3] == (True, True, False)
    assert not [w for w in _not_read_warnings(parsed) if "activation_checkpointing" in w]
    # number_checkpoints is the one key the fork overwrites (with --num-layers)
    ds = argv[argv.index("--deepspeed_config") + 1]
    config = json.loads(open(ds).read())
    config["activation_checkpointing"]["number_checkpoints"] = 64
    open(ds, "w").write(json.dumps(config))
    parsed = parse_arguments(argv)
    assert _activations(parsed)[1:] == (True, False, None)
    assert "num_checkpoints=--num-layers" in _not_read_warnings(parsed)[0]
    # without the flag, the same fork uses Megatron's own checkpoint function: the block is not read
    parsed = parse_arguments([token for token in argv if token != "--deepspeed-activation-checkpointing"])
    assert _activations(parsed)[:2] == (True, False)


def test_deepspeeds_own_gpt2_test_without_the_flag_checkpoints_unpartitioned(tmp_path):
    """microsoft/DeepSpeed@4b358333 tests/model/Megatron_GPT2/ds_gpt2_test.sh lines 88-89 pass
    --checkpoint-activations but never --deepspeed-activation-checkpointing, beside a JSON whose block asks for
    partition_activations and contiguous_memory_optimization: the 2020 fork then checkpoints with its own mpu
    function, unpartitioned."""
    parsed = parse_arguments(_shrunk("deepspeed-megatron-gpt2-test-mp2-gpu4-zero2-gas", tmp_path))
    assert _activations(parsed)[:3] == (True, False, False)  # was (True, True, True)
    assert "activation_checkpointing.partition_activations" in " ".join(_not_read_warnings(parsed))


def test_a_preset_launch_reads_the_block_and_it_turns_checkpointing_on(tmp_path):
    parsed = parse_arguments(["--config", "tiny", "--zero-config", _json(tmp_path, BLOCK)])
    assert _activations(parsed)[:3] == (True, True, True)
    assert not _not_read_warnings(parsed)
