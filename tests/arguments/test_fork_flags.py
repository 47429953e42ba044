"""The pretraining forks' own flags, read with their fork's meaning (issue 54 item 5).

llm-jp's Megatron-LM fork (github llm-jp/Megatron-LM; llm-jp/scripts installs branch nii-geniac for its v3
scripts and branch v4 for v4) and swiss-ai's (github swiss-ai/Megatron-LM, main)."""

import pytest

from arguments.parser import parse_arguments
from base.errors import ConfigError
from parallel.launch_environment import adopt_openmpi_ranks, read_launch_environment


def test_use_mpi_takes_openmpis_ranks():
    """llm-jp nii-geniac and v4, megatron/training/arguments.py parse_args: `if args.use_mpi:` sets RANK,
    LOCAL_RANK and WORLD_SIZE from OMPI_COMM_WORLD_RANK, _LOCAL_RANK and _SIZE."""
    assert parse_arguments(["--use-mpi"]).config.training.faults.use_mpi
    # mpirun inside an sbatch job: SLURM's batch-step variables say rank 0 of 8 for every process
    environ = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "8",
               "SLURM_JOB_NODELIST": "node[1-2]", "MASTER_ADDR": "node1", "MASTER_PORT": "12345"}
    assert read_launch_environment(environ).rank == 0
    assert adopt_openmpi_ranks(environ) is None
    launch = read_launch_environment(environ)
    assert (launch.launcher, launch.rank, launch.local_rank, launch.world_size, launch.local_world_size,
            launch.master_addr, launch.master_port) == ("torchrun", 5, 1, 8, 4, "node1", 12345)


def test_use_mpi_outside_mpirun_leaves_the_launchers_ranks_and_says_so():
    environ = {"RANK": "1", "WORLD_SIZE": "2"}
    note = adopt_openmpi_ranks(environ)
    assert note.startswith("--use-mpi: OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE are not set")
    assert environ == {"RANK": "1", "WORLD_SIZE": "2"}


def test_use_mpi_end_to_end_prints_the_note(tmp_path, corpus_cache_300, capsys, monkeypatch):
    import pretrain_gpt
    from tests.reliability_helpers import TINY

    for variable in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    assert pretrain_gpt.main(TINY + ["--train-iters", "1", "--data-cache-dir", corpus_cache_300, "--use-mpi",
                                     "--metrics-file", str(tmp_path / "m.jsonl")]) == 0
    assert "> --use-mpi: OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE are not set" in capsys.readouterr().out


def test_wandb_name_is_the_run_name():
    """llm-jp nii-geniac, megatron/training/global_vars.py _set_wandb_writer: `'name': exp_name` from
    args.wandb_name (the fork appends its start time; W&B tells runs apart by id, so it is taken as given)."""
    assert parse_arguments(["--wandb-name", "llmjp3-1.8b"]).config.logging.wandb_run_name == "llmjp3-1.8b"


def test_z_loss_flags():
    """llm-jp v4 megatron/training/arguments.py: --z-loss-strength (float, default 0.0, 'If set to 0, Z-loss is
    not applied'); nii-geniac: --use-z-loss, cross_entropy.py's fixed `1e-4 * log_Z * log_Z`."""
    assert parse_arguments([]).config.model.output.z_loss_strength == 0.0
    assert parse_arguments(["--use-z-loss"]).config.model.output.z_loss_strength == 1e-4
    assert parse_arguments(["--z-loss-strength", "1e-3"]).config.model.output.z_loss_strength == 1e-3
    with pytest.raises(ConfigError, match="--z-loss-strength must be 0 or more"):
        parse_arguments(["--z-loss-strength", "-1"])
    with pytest.raises(ConfigError, match="z-loss is not implemented in the fused output layer"):
        parse_arguments(["--use-z-loss", "--cross-entropy-loss-fusion"])


def test_trigger_path_is_a_setting():
    """swiss-ai main, megatron/training/arguments.py: --trigger-path ('Path to check for exit & save triggers')."""
    assert parse_arguments(["--trigger-path", "triggers"]).config.checkpoint.trigger_path == "triggers"


def test_the_forks_are_harvested_sources():
    """scripts/tools/harvest_megatron_flags.sh reads each fork's arguments.py at a named commit, as Megatron-LM's."""
    from arguments.megatron.harvested_flags import harvested

    sources = {source["label"]: source for source in harvested()["sources"]}
    assert sources["llm-jp-megatron-lm-v4"]["repository"] == "llm-jp/Megatron-LM"
    assert sources["llm-jp-megatron-lm-nii-geniac"]["commit"].startswith("6439bf6f")
    assert sources["swiss-ai-megatron-lm"]["repository"] == "swiss-ai/Megatron-LM"
    assert sources["pai-megatron-patch"]["path"] == "megatron_patch/arguments.py"
    flags = harvested()["flags"]
    assert flags["--use-mpi"]["sources"] == ["llm-jp-megatron-lm-v4", "llm-jp-megatron-lm-nii-geniac"]
    assert flags["--trigger-path"]["sources"] == ["swiss-ai-megatron-lm"]
    assert "pai-megatron-patch" in flags["--patch-tokenizer-type"]["sources"]


def test_rope_theta_is_the_rotary_base():
    """llm-jp nii-geniac pretrain_gpt.py model_provider: `rotary_base=args.rope_theta`."""
    assert parse_arguments(["--rope-theta", "500000"]).config.model.positions.rotary_base == 500000


def test_fork_flags_that_change_the_math_are_refused_in_one_line_naming_the_fork():
    """swiss-ai main megatron/training/arguments.py: --xiprelu, --post-layer-norm (its --xielu and --goldfish-loss
    are implemented: tests/gpt/test_xielu.py, tests/data/test_goldfish.py); llm-jp nii-geniac
    megatron/core/models/gpt/gpt_model.py: `if self.use_embedding_scaling:` scales the embeddings."""
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--xiprelu", "--post-layer-norm",
                         "--use-embedding-scaling", "--input-embeddings-multiplier", "2"])
    message = str(error.value)
    assert "\n" not in message
    for flag in ("--xiprelu", "--post-layer-norm", "--input-embeddings-multiplier 2.0"):
        assert f"{flag}: not implemented (swiss-ai's Megatron-LM fork" in message, flag
    assert "--use-embedding-scaling: not implemented (llm-jp's Megatron-LM fork" in message


def test_fork_flags_with_no_effect_are_said_once():
    parsed = parse_arguments(["--qknorm-impl", "torch", "--log-params-norm-per-param", "--layernorm-init", "1.0",
                              "--encoder-tensor-model-parallel-size", "0", "--s3-cache-path", "cache"])
    line = next(note for note in parsed.notes if "--qknorm-impl torch" in note)
    for flag in ("--log-params-norm-per-param", "--layernorm-init 1.0", "--encoder-tensor-model-parallel-size 0",
                 "--s3-cache-path cache"):
        assert flag in line


def test_geniac_forks_underscore_wandb_flags_are_its_wandb_settings():
    """hotsuyuki/Megatron-DeepSpeed (ucllm_nedo_dev tags), megatron/arguments.py: `--use-wandb`/`--use_wandb`,
    `--wandb-entity`/`--wandb_entity`, `--wandb-project`/`--wandb_project`, `--wandb-group`/`--wandb_group`,
    `--wandb-tag`/`--wandb_tag`; training.py's wandb.init(entity, project, group) under --use-wandb."""
    parsed = parse_arguments(["--use_wandb", "--wandb_entity", "team", "--wandb_project", "pretrain",
                              "--wandb_group", "g", "--wandb-tag", "t"])
    assert (parsed.config.logging.wandb_entity, parsed.config.logging.wandb_project) == ("team", "pretrain")
    line = next(note for note in parsed.notes if "--use_wandb" in note)
    assert "--wandb_group" in line and "--wandb-tag" in line


def test_pai_megatron_patch_flags_are_refused_naming_the_project_and_what_it_would_take():
    """alibaba/Pai-Megatron-Patch megatron_patch/arguments.py get_patch_args adds --patch-tokenizer-type,
    --dataset, --extra-vocab-size ... through patch_if_not_exist (its examples' run_mcore_*.sh pass them)."""
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--patch-tokenizer-type", "Qwen2Tokenizer", "--dataset", "MMAP", "--extra-vocab-size", "293"])
    message = str(error.value)
    assert "\n" not in message and "unrecognized" not in message
    assert ("--patch-tokenizer-type Qwen2Tokenizer: Pai-Megatron-Patch's own flag (alibaba/Pai-Megatron-Patch "
            "megatron_patch/arguments.py)") in message
    assert "running it would take porting megatron_patch's tokenizers, datasets and models" in message
    assert "--dataset MMAP" in message and "--extra-vocab-size 293" in message


def test_swiss_ais_1_sqrt_anneal_is_minus_sqrt():
    """swiss-ai main megatron/core/optimizer_param_scheduler.py get_lr: `elif self.lr_wsd_decay_style == "1-sqrt":
    coeff = 1.0 - math.sqrt(wsd_decay_ratio)`, Megatron-LM main's minus_sqrt; it is the fork's default, which a
    launch of that fork takes."""
    from arguments.schedule import wsd_coefficient

    config = parse_arguments(["--lr-decay-style", "WSD", "--lr-wsd-decay-style", "1-sqrt",
                              "--lr-wsd-decay-iters", "10"]).config
    assert config.optimizer.lr_wsd_decay_style == "1-sqrt"
    for ratio in (0.0, 0.25, 0.5, 1.0):
        assert wsd_coefficient("1-sqrt", ratio) == wsd_coefficient("minus_sqrt", ratio) == 1.0 - ratio ** 0.5


def test_a_launch_typing_a_forks_flag_takes_that_forks_defaults():
    """A fork's own flag makes the launch that fork's (arguments/megatron/defaults.py, launch_generation): its
    argument file's defaults apply, as they do when the script runs there (swiss-ai main megatron/training/
    arguments.py: `--lr-wsd-decay-style` default '1-sqrt'); a launch no fork fits better stays Megatron-LM's."""
    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2"]
    swiss = parse_arguments(model + ["--trigger-path", "triggers"])
    assert swiss.megatron_generation == "swiss-ai-megatron-lm"
    assert swiss.config.optimizer.lr_wsd_decay_style == "1-sqrt"
    assert parse_arguments(model + ["--use-z-loss"]).megatron_generation == "llm-jp-megatron-lm-nii-geniac"
    plain = parse_arguments(model + ["--micro-batch-size", "2"])
    assert plain.megatron_generation == "megatron-lm"
    assert plain.config.optimizer.lr_wsd_decay_style == "exponential"


def test_ademamix_and_its_knobs_are_settings_with_the_forks_meaning_and_defaults():
    """swiss-ai main megatron/training/arguments.py: --optimizer choices ['adam', 'sgd', 'ademamix'];
    _add_regularization_args: --ademamix-beta3 (float, default 0.999), --ademamix-alpha (float, 5),
    --ademamix-beta3-warmup (int, -1), --ademamix-alpha-warmup (int, -1), read into OptimizerConfig by
    training.py setup_model_and_optimizer and handed to AdEMAMix by megatron/core/optimizer/__init__.py
    (betas (adam_beta1, adam_beta2, ademamix_beta3), alpha, beta3_warmup, alpha_warmup). Apertus' pretraining
    script passes all four (tests/replay_corpus/forks.py). The step itself: tests/zero/test_ademamix.py."""
    optimizer = parse_arguments(["--optimizer", "ademamix", "--ademamix-alpha", "8", "--ademamix-beta3", "0.9999",
                                 "--ademamix-beta3-warmup", "100000", "--ademamix-alpha-warmup", "50000"]
                                ).config.optimizer
    knobs = optimizer.algorithms
    assert (optimizer.optimizer, knobs.ademamix_alpha, knobs.ademamix_beta3, knobs.ademamix_beta3_warmup,
            knobs.ademamix_alpha_warmup) == ("ademamix", 8.0, 0.9999, 100000, 50000)
    defaults = parse_arguments(["--optimizer", "ademamix"]).config.optimizer.algorithms
    assert (defaults.ademamix_alpha, defaults.ademamix_beta3, defaults.ademamix_beta3_warmup,
            defaults.ademamix_alpha_warmup) == (5.0, 0.999, -1, -1)
    assert parse_arguments([]).config.optimizer.optimizer == "adam"


@pytest.mark.parametrize("argv, words", [
    (["--optimizer", "sgd"], ("--optimizer sgd is not implemented", "adam", "ademamix")),
    (["--optimizer", "lion"], ("--optimizer lion is not implemented", "muon")),
    (["--optimizer", "ademamix", "--ademamix-beta3", "1.0"], ("--ademamix-beta3 must be in [0, 1)",)),
    (["--optimizer", "ademamix", "--ademamix-alpha", "-1"], ("--ademamix-alpha >= 0",)),
])
def test_other_optimizers_and_out_of_range_ademamix_knobs_are_refused_in_one_line(argv, words):
    """The fork's AdEMAMix.__init__ refuses beta3 outside [0, 1) and a negative alpha; SGD and Megatron-LM main's
    other optimizers (but Muon: tests/arguments/test_muon_flags.py) are not implemented here."""
    with pytest.raises(ConfigError) as error:
        parse_arguments(argv)
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_every_fork_only_flag_names_its_fork_or_is_a_setting_here():
    """Each option string only the forks' argument files define (llm-jp v4 and nii-geniac
    megatron/training/arguments.py, swiss-ai main megatron/training/arguments.py, Pai-Megatron-Patch
    megatron_patch/arguments.py get_patch_args) is either a setting here with the fork's meaning or classified
    with a reason that names the fork it comes from."""
    from arguments.megatron.flag_classes import AT_VALUE, CLASS_OF
    from arguments.megatron.harvested_flags import harvested
    from arguments.option_table import option_table
    from arguments.parser import build_parser

    names = {"llm-jp-megatron-lm-v4": "llm-jp", "llm-jp-megatron-lm-nii-geniac": "llm-jp",
             "swiss-ai-megatron-lm": "swiss-ai", "pai-megatron-patch": "Pai-Megatron-Patch",
             "lola-megatron-deepspeed": "LOLA"}
    table = option_table(build_parser())
    fork_only = {option: entry["sources"] for option, entry in harvested()["flags"].items()
                 if set(entry["sources"]) <= set(names)}
    assert len(fork_only) > 100
    for option, sources in fork_only.items():
        if option not in CLASS_OF:
            assert option in table, option  # ours: --use-mpi, --use-z-loss, --z-loss-strength, --trigger-path ...
            continue
        kind, reason = CLASS_OF[option]
        text = reason + (AT_VALUE[option].refused if option in AT_VALUE else "")
        assert any(names[source] in text for source in sources), (option, text)


def test_moe_token_dropping_is_refused_with_megatron_cores_router_as_llm_jps_fork_asserts():
    """llm-jp's Megatron-LM fork (branch nii-geniac) defines --moe-token-dropping (megatron/training/arguments.py)
    and asserts it off (megatron/core/transformer/moe/router.py: `assert config.moe_token_dropping is False`): with
    experts and Megatron-Core's router it is refused in one line here, not taken silently; a dense model keeps it as
    the fork's no-op, and DeepSpeed-MoE's gating reads it as its own switch."""
    from arguments.parser import parse_arguments
    from base.errors import ConfigError

    base = ["--hidden-size", "128", "--num-attention-heads", "4", "--num-layers", "4"]
    parse_arguments(base + ["--moe-token-dropping"])
    with pytest.raises(ConfigError, match="--moe-token-dropping with Megatron-Core's router"):
        parse_arguments(base + ["--num-experts", "4", "--moe-token-dropping"])
    parse_arguments(base + ["--num-experts", "4", "--moe-gating", "deepspeed", "--moe-token-dropping"])


def test_topk_limited_devices_is_group_limited_routing_over_the_expert_parallel_ranks():
    """swiss-ai's fork parses --moe-router-topk-limited-devices and hands it to Megatron-Core's TransformerConfig,
    whose __post_init__ (megatron/core/transformer/transformer_config.py, core_v0.16.1) sets
    `moe_router_group_topk = moe_router_topk_limited_devices` and `moe_router_num_groups =
    expert_model_parallel_size`, and raises with --moe-router-group-topk given too. Round 5 found it called dense."""
    moe = ["--num-experts", "8", "--moe-router-topk", "2", "--expert-model-parallel-size", "4"]
    parsed = parse_arguments(moe + ["--moe-router-topk-limited-devices", "2"])
    routing = parsed.config.model.moe_of(0)
    assert (routing.router_num_groups, routing.router_group_topk) == (4, 2)
    assert any("--moe-router-topk-limited-devices 2: deprecated in Megatron-Core, which routes as "
               "--moe-router-num-groups 4" in note for note in parsed.notes)
    assert not any("dense" in note and "limited-devices" in note for note in parsed.notes)
    with pytest.raises(ConfigError, match="moe_router_topk_limited_devices is deprecated and replaced by"):
        parse_arguments(moe + ["--moe-router-topk-limited-devices", "2", "--moe-router-num-groups", "4",
                               "--moe-router-group-topk", "2"])
    dense = parse_arguments(["--moe-router-topk-limited-devices", "2"])
    assert "> --moe-router-topk-limited-devices 2: no effect on a dense model (no --num-experts)" in dense.notes
    assert dense.config.model.experts.router_group_topk is None
