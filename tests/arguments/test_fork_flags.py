"""The pretraining forks' own flags, read with their fork's meaning (issue 54 item 5).

llm-jp's Megatron-LM fork (github llm-jp/Megatron-LM; llm-jp/scripts installs branch nii-geniac for its v3
scripts and branch v4 for v4) and swiss-ai's (github swiss-ai/Megatron-LM, main)."""

import pytest

from arguments.parser import parse_arguments
from base.errors import ConfigError
from parallel.state import adopt_openmpi_ranks, read_launch_environment


def test_use_mpi_takes_openmpis_ranks():
    """llm-jp nii-geniac and v4, megatron/training/arguments.py parse_args: `if args.use_mpi:` sets RANK,
    LOCAL_RANK and WORLD_SIZE from OMPI_COMM_WORLD_RANK, _LOCAL_RANK and _SIZE."""
    assert parse_arguments(["--use-mpi"]).config.training.use_mpi
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
    assert parse_arguments([]).config.model.z_loss_strength == 0.0
    assert parse_arguments(["--use-z-loss"]).config.model.z_loss_strength == 1e-4
    assert parse_arguments(["--z-loss-strength", "1e-3"]).config.model.z_loss_strength == 1e-3
    with pytest.raises(ConfigError, match="--z-loss-strength must be 0 or more"):
        parse_arguments(["--z-loss-strength", "-1"])
    with pytest.raises(ConfigError, match="z-loss is not implemented in the fused output layer"):
        parse_arguments(["--use-z-loss", "--cross-entropy-loss-fusion"])


def test_trigger_path_is_a_setting():
    """swiss-ai main, megatron/training/arguments.py: --trigger-path ('Path to check for exit & save triggers')."""
    assert parse_arguments(["--trigger-path", "triggers"]).config.checkpoint.trigger_path == "triggers"
