"""The planner plans pipeline stages (issue 38, point 5): one rank of a PP x DP x TP grid, its stage's own layers,
its schedule's saved activations, the sends the executor holds, the bubble and the point-to-point bytes.

Before, `dry_run` refused --pipeline-model-parallel-size > 1 in one line (planner/dry_run.py's check_plannable).

The schedule's in-flight counts are Megatron-Core's (github:NVIDIA/Megatron-LM,
megatron/core/pipeline_parallel/schedules.py): `forward_backward_pipelining_without_interleaving` runs
`num_warmup_microbatches = min(pipeline_parallel_size - pipeline_parallel_rank - 1, num_microbatches)` forwards
before its first backward, so stage s holds min(P - s, M) micro-batches' activations at once;
`forward_backward_pipelining_with_interleaving` runs `(pipeline_parallel_size - pipeline_parallel_rank - 1) * 2
+ (num_model_chunks - 1) * pipeline_parallel_size` warm-up forwards (capped at all of them: get_pp_rank_microbatches). The bubble is
Narayanan et al. 2021 (section 2.2): (p - 1) / (v m) of the ideal time, so (p - 1) / (v m + p - 1) of the whole.
"""

from __future__ import annotations

import pytest

from arguments.parser import parse_config
from planner import pipeline_plan
from planner.dry_run import Cluster, dry_run
from planner.pipeline_plan import bubble_fraction
from planner.plan import main as plan_main

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--tokenizer-vocab-size", "512",
         "--hidden-dropout", "0", "--attention-dropout", "0"]
VOCAB = 512
MESSAGE = 2 * 32 * 64 * 4  # [micro batch, seq, hidden] fp32


def plan(rank: int, *flags: str, world: int = 4):
    config = parse_config([*MODEL, *flags])
    return dry_run(config, Cluster(world, world, None, "cuda"), VOCAB, rank)


def test_each_stage_plans_its_own_layers_and_its_schedules_activations():
    # PP 2 x DP 2, 1F1B, M = 16 / (2 x 2) = 4 micro-batches; ranks 0, 1 are stage 0, ranks 2, 3 stage 1
    flags = ("--pipeline-model-parallel-size", "2", "--global-batch-size", "16", "--zero-stage", "1")
    first, last, whole = plan(0, *flags), plan(2, *flags), plan(0, "--global-batch-size", "16", "--zero-stage", "1")
    assert (first.pipeline.pipeline_parallel_rank, last.pipeline.pipeline_parallel_rank) == (0, 1)
    assert first.pipeline.micro_batches == last.pipeline.micro_batches == 4
    # min(P - s, M) forwards await their backward: the first stage keeps two micro-batches, the last one
    assert (first.pipeline.peak_chunk_forwards_in_flight, last.pipeline.peak_chunk_forwards_in_flight) == (2, 1)
    # the stages split the model: 2 blocks each, the embedding on the first, the final norm and the tied copy of
    # the word embedding on the last; so together they hold the one-stage model plus that copy
    word_embedding = 512 * 64
    assert first.parameters_local + last.parameters_local == whole.parameters_local + word_embedding
    assert first.parameters_local - word_embedding - 32 * 64 == last.parameters_local - word_embedding - 2 * 64
    # half the blocks, but twice the micro-batches in flight: the first stage saves what the one-stage model does
    # per micro-batch, the last half of it (plus its loss)
    assert first.saved_activation_bytes["device"] > last.saved_activation_bytes["device"]
    # only the last stage has logits and a loss
    assert first.logits_bytes == 0 and last.logits_bytes == whole.logits_bytes > 0
    # each stage sends one message per micro-batch: activations forward from the first, gradients back from the last,
    # each held until its rank's slot two on (parallel/p2p.py): the first stage's warm-up forward and
    # the next, not all four
    assert first.pipeline.p2p_sent_bytes == last.pipeline.p2p_sent_bytes == 4 * MESSAGE
    assert first.pipeline.p2p_held_bytes == 2 * MESSAGE
    assert first.pipeline.bubble_fraction == pytest.approx(1 / 5)
    # the largest parameter gradient, the word embedding's, is read where it arrives: last in the first stage's
    # backward, once that micro-batch's saved tensors are freed, so below the schedule's peak with it on top
    embedding_gradient = word_embedding * 4
    assert first.parameter_gradient_bytes == embedding_gradient
    assert embedding_gradient < first.pipeline.gradient_arrival_peak_bytes < \
        first.pipeline.pass_peak_bytes + embedding_gradient


def test_interleaving_holds_megatrons_warmup_forwards():
    # PP 2 x DP 1 at world 2, 4 layers in chunks of 1 layer: vp = 2; M = 8 micro-batches (a multiple of P)
    flags = ("--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
             "--global-batch-size", "16")
    first, last = plan(0, *flags, world=2), plan(1, *flags, world=2)
    stages, chunks = 2, 2
    for stage, planned in ((0, first), (1, last)):
        warmup = (stages - stage - 1) * 2 + (chunks - 1) * stages
        assert planned.pipeline.chunks == chunks
        assert planned.pipeline.peak_chunk_forwards_in_flight == warmup + 1
        # every chunk-forward but the model's last sends an activation, every chunk-backward but the first's a gradient
        assert planned.pipeline.p2p_sent_bytes == (2 * 8 * chunks - 8) * MESSAGE
        assert planned.pipeline.bubble_fraction == pytest.approx(bubble_fraction(2, 8, 2)) == pytest.approx(1 / 17)
        # a send is held two slots on, also where no receive comes (the first stage's chunk-0 warm-up held three)
        assert planned.pipeline.p2p_held_bytes == 2 * MESSAGE


@pytest.mark.parametrize("rank, world, flags", [
    (0, 2, ("--global-batch-size", "32")),
    (0, 2, ("--global-batch-size", "32", "--num-layers-per-virtual-pipeline-stage", "1")),
    # the last stage (rank 2 of PP 2 x TP 2), under TP's collectives with sequence parallelism: before, it planned
    # one micro-batch, whose backward is the last, so there was no backward under no_sync to repeat (stage 2's
    # reductions of the others were missing), and the forwards' TP collectives were not repeated at all
    (2, 4, ("--global-batch-size", "32", "--tensor-model-parallel-size", "2", "--sequence-parallel"))])
def test_planning_fewer_micro_batches_gives_the_full_schedules_plan(monkeypatch, rank, world, flags):
    """M' micro-batches reach the steady state: the plan of a stage equals the one that runs all M."""
    flags = ("--pipeline-model-parallel-size", "2", "--zero-stage", "2", *flags)
    truncated = plan(rank, *flags, world=world)
    assert truncated.pipeline.simulated_micro_batches < truncated.pipeline.micro_batches == 16
    monkeypatch.setattr(pipeline_plan, "simulated_micro_batches", lambda micro_batches, *_: micro_batches)
    full = plan(rank, *flags, world=world)
    assert full.pipeline.simulated_micro_batches == 16
    assert truncated.total_bytes == full.total_bytes
    assert truncated.saved_activation_bytes == full.saved_activation_bytes
    assert truncated.pipeline == full.pipeline.__class__(**{**full.pipeline.__dict__,
                                                            "simulated_micro_batches": truncated.pipeline.simulated_micro_batches})
    assert truncated.comm_bytes == full.comm_bytes  # stage 2 reduces every micro-batch: added for the rest


def test_the_command_line_reports_every_stage_and_the_worst(capsys):
    assert plan_main(["dry-run", *MODEL, "--world-size", "4", "--gpu-memory", "1GB", "--global-batch-size", "8",
                      "--pipeline-model-parallel-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "PP rank 0" in out and "PP 4 x TP 1 x DP 1" in out and "bubble 42.9% of the iteration" in out
    assert all(f"stage   {stage} rank     {stage}:" in out for stage in range(4))
    assert "worst stage: 0 (" in out


def test_a_pipeline_launchs_dry_run_plans_its_stage(monkeypatch, capsys):
    """pretrain_gpt.py --dry-run as rank 0 of a 4-process PP 2 launch: DP is 4 / (TP x PP) = 2, so 16 samples are
    4 micro-batches of 2 (the launch's batch schedule used to divide the world by TP alone: DP 4, 2 micro-batches)."""
    import pretrain_gpt

    for name, value in {"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    assert pretrain_gpt.main([*MODEL, "--global-batch-size", "16",
                              "--pipeline-model-parallel-size", "2", "--device", "cpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "PP rank 0" in out and "PP 2 x TP 1 x DP 2" in out and "1F1B, 4 micro-batches" in out


@pytest.mark.parametrize("world, flags", [("1", ("--pipeline-model-parallel-size", "2")),
                                          ("2", ("--tensor-model-parallel-size", "2",
                                                 "--pipeline-model-parallel-size", "2")),
                                          ("3", ("--tensor-model-parallel-size", "2"))])
def test_a_dry_run_whose_grid_does_not_fit_the_launch_is_the_live_launchs_one_line(monkeypatch, capsys, world, flags):
    """--dry-run of a launch whose TP x PP does not divide its processes: the live launch's refusal
    (parallel/state.py check_grid_divides), exit 2, not a ZeroDivisionError traceback from the batch arithmetic
    (DP = 1 // 2 = 0)."""
    import pretrain_gpt

    for name, value in {"WORLD_SIZE": world, "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": world}.items():
        monkeypatch.setenv(name, value)
    assert pretrain_gpt.main([*MODEL, *flags, "--device", "cpu", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert "does not divide the " + world + " launched processes" in captured.err
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize("flags", [("--global-batch-size", "16"),
                                   ("--global-batch-size", "16", "--num-layers-per-virtual-pipeline-stage", "1")])
def test_report_memorys_stage_prediction_is_the_planners(flags):
    """--report-memory's predicted checkpointed inputs on a stage (training/memory_report.py: the stage's chunks over
    the forwards its schedule keeps awaiting their backward) equal what the planner's dry run of that rank measures,
    1F1B and interleaved; the 2-rank launch in tests/training/test_pipeline_training.py compares both with the live
    measurement. Before, every stage predicted one micro-batch of the whole model."""
    from parallel.state import virtual_state
    from training.memory_report import saved_activation_record
    from training.run_settings import resolve_run_settings
    from zero.activations import SavedTensorMeter

    flags = ("--pipeline-model-parallel-size", "2", "--checkpoint-activations", *flags)
    config = parse_config([*MODEL, *flags])
    settings = resolve_run_settings(config, VOCAB, 1, 1, "cpu")
    for rank in (0, 1):
        planned = plan(rank, *flags, world=2)
        state = virtual_state(2, 1, rank, pipeline_parallel_size=2)
        record = saved_activation_record(SavedTensorMeter(state.device), settings, state,
                                         settings.batch.final_accumulation_steps)
        assert record["chunk_forwards_in_flight"] == planned.pipeline.peak_chunk_forwards_in_flight, rank
        assert record["predicted_checkpointed_input_bytes"] == sum(planned.checkpoint_bytes.values()) > 0, rank


@pytest.mark.parametrize("counted, uneven", [("--account-for-embedding-in-pipeline-split", "3"),
                                             ("--account-for-loss-in-pipeline-split", "4")])
def test_the_planner_plans_the_split_with_the_embedding_or_loss_counted(counted, uneven):
    """7 layers + the embedding (the loss) over 2 stages: 4 slots each, so stage 0 builds 3 (4) layers and stage 1
    the other 4 (3), as Megatron-Core's get_num_layers_to_build; each rank plans the parameters of the same split
    given as --decoder-first-pipeline-num-layers."""
    flags = ("--num-layers", "7", "--pipeline-model-parallel-size", "2", "--global-batch-size", "8")
    for rank in (0, 1):
        assert plan(rank, *flags, counted, world=2).parameters_local == \
            plan(rank, *flags, "--decoder-first-pipeline-num-layers", uneven, world=2).parameters_local


def test_the_planner_runs_megatrons_grouped_interleaved_schedule():
    """--microbatch-group-size-per-virtual-pipeline-stage 4 with 2 chunks, P 2, M 8: get_pp_rank_microbatches'
    (P - s - 1) x 2 + (vp - 1) x G warm-up forwards await their backward, then one more; all M are simulated."""
    flags = ("--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
             "--microbatch-group-size-per-virtual-pipeline-stage", "4", "--global-batch-size", "16")
    for stage in (0, 1):
        planned = plan(stage, *flags, world=2)
        assert planned.pipeline.simulated_micro_batches == planned.pipeline.micro_batches == 8
        assert planned.pipeline.peak_chunk_forwards_in_flight == (2 - stage - 1) * 2 + (2 - 1) * 4 + 1


def test_a_stage_without_moe_layers_is_planned_with_the_others(capsys):
    """Issue 77: with `--moe-layer-freq [0,0,1,1]` at TP 2 x PP 2 (expert TP 1) the first stage holds no expert. Its
    dry run used to build the experts' ZeRO and die ("the model has no expert parameter"), so a launch's memory check
    said only "memory not checked before the build"; now it has none (zero/experts.py) and every stage is planned."""
    assert plan_main(["dry-run", *MODEL, "--world-size", "4", "--gpu-memory", "1GB", "--global-batch-size", "8",
                      "--num-experts", "4", "--moe-layer-freq", "[0,0,1,1]", "--tensor-model-parallel-size", "2",
                      "--sequence-parallel", "--pipeline-model-parallel-size", "2",
                      "--expert-tensor-parallel-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "PP rank 0" in out and "PP 2 x TP 2 x DP 1" in out and "worst stage: " in out
    assert "stage   0 rank     0:" in out and "stage   1 rank     2:" in out
    assert "the experts'" not in out  # the first stage's rank: no experts' states, no experts' rows
