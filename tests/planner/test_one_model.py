"""One model of time and memory behind `python -m zero.plan search` and `dry-run` (issue 80): a layout the search
prints, given to `zero.plan dry-run --hardware` as printed, reads back as the same Layout, and the dry run prints the
search's step time and the search's memory, stage by stage, on a dense and an MoE shape at several layouts; what the
user pins stays pinned and is on the line once; the answer is a command."""

import json
import shlex

import pytest

from arguments.parser import parse_arguments, parse_config
from planner.layout_of_config import layout_of_config
from planner.layout_search import search
from planner.perf_model import load_hardware
from planner.plan import main
from planner.search_check import check_picks
from planner.search_report import explain_losses, loss_reason
from planner.vocabulary import launch_vocab

DENSE = ["--config", "llama-tiny", "--global-batch-size", "32"]
# 4 layers, 4 experts of top-2 with a SwiGLU MLP: EP 1, 2 and 4 on 4 GPUs
MOE = ["--config", "llama-tiny", "--global-batch-size", "32", "--num-experts", "4", "--moe-router-topk", "2",
       "--moe-ffn-hidden-size", "128"]
H100 = load_hardware("h100-sxm")


KINDS = {"pipeline stages": lambda layout: layout.pp > 1, "tensor parallel": lambda layout: layout.tp > 1,
         "ZeRO-3": lambda layout: layout.stage == 3, "full recompute": lambda layout: layout.recompute_fraction == 1.0,
         "expert parallel": lambda layout: layout.ep > 1}


def one_of_each_kind(candidates) -> list:
    """The best fitting candidate of each kind in KINDS that the search has (a candidate counted once)."""
    picked = []
    for kind in KINDS.values():
        pick = next((c for c in candidates if c.fits and kind(c.layout) and c not in picked), None)
        if pick is not None:
            picked.append(pick)
    return picked


def distinct(candidates) -> list:
    """The best fitting candidate of each (TP, PP, interleaved or not, EP, ZeRO stage, recompute)."""
    seen, picked = set(), []
    for candidate in (c for c in candidates if c.fits):
        layout = candidate.layout
        key = (layout.tp, layout.pp, layout.vp > 1, layout.ep, layout.stage, layout.recompute_fraction)
        if key not in seen:
            seen.add(key)
            picked.append(candidate)
    return picked


@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
def test_every_printed_line_reads_back_as_the_layout_the_search_priced(model):
    config = parse_config(model)
    counts, candidates = search(config, 4, H100, launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0])
    fitting = distinct(candidates)
    assert len({(c.layout.tp, c.layout.pp, c.layout.ep) for c in fitting}) >= 4
    for candidate in fitting:
        words = [*model, *candidate.flag_words]
        back = parse_config(words)
        back = layout_of_config(back.model, back.parallel, back.training, back.zero, back.activations, 4, counts)
        assert back == candidate.layout, shlex.join(candidate.flag_words)
        assert words.count("--bf16") == 1 and "--tp-comm-overlap" not in words
        assert all(chunk for chunks in candidate.layout.stage_counts or () for chunk in chunks)  # no empty chunk


@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
def test_the_dry_run_of_a_printed_line_gives_the_searchs_step_and_memory_stage_by_stage(model, capsys):
    config = parse_config(model)
    _, candidates = search(config, 4, H100, launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0])
    picks = one_of_each_kind(candidates)
    assert len(picks) == (5 if "--num-experts" in model else 4)
    for pick in picks:
        check_picks([pick], model, H100, 1, 1)
        assert main(["dry-run", "--hardware", "h100-sxm", "--world-size", "4", "--json", *model,
                     *pick.flag_words]) == 0
        planned = json.loads(capsys.readouterr().out)
        stages = [stage["total_bytes"] for stage in planned.get("stages", [planned])]
        assert stages == pick.stage_bytes and len(stages) == pick.layout.pp, pick.flags()
        assert planned["step_s"] == pytest.approx(pick.prediction.step_s, rel=1e-12), pick.flags()


def test_a_pinned_dimension_is_searched_at_its_value_and_its_flag_is_the_users_once():
    pinned = [*DENSE, "--zero-stage", "1", "--tensor-model-parallel-size", "2", "--recompute-granularity", "full",
              "--fp16"]
    config = parse_config(pinned)
    _, candidates = search(config, 4, H100)
    fitting = [c for c in candidates if c.fits]
    assert fitting and all((c.layout.stage, c.layout.tp, c.layout.recompute_fraction) == (1, 2, 1.0)
                           for c in fitting)
    for candidate in fitting:
        words = [*pinned, *candidate.flag_words]
        for flag in ("--zero-stage", "--tensor-model-parallel-size", "--recompute-granularity", "--sequence-parallel"):
            assert words.count(flag) <= 1, (flag, candidate.flags())
        assert "--use-distributed-optimizer" not in words and "--bf16" not in words and "--fp16" in words
        back = parse_config(words)
        assert layout_of_config(back.model, back.parallel, back.training, back.zero, back.activations, 4,
                                search(config, 4, H100)[0]) == candidate.layout


def test_flags_the_trainer_accepts_with_no_effect_are_left_out_of_the_commands(capsys):
    assert main(["search", *DENSE, "--gpus", "4", "--hardware", "h100-sxm", "--tp-comm-overlap",
                 "--no-dry-run-check", "--top", "2"]) == 0
    out = capsys.readouterr().out
    picks = [line for line in out.splitlines() if line.startswith("   torchrun --nproc-per-node 4 pretrain_gpt.py ")]
    assert len(picks) == 2 and all("--tp-comm-overlap" not in line for line in picks)
    assert "left out of the commands: --tp-comm-overlap" in out and "--data-path" in out


def test_the_search_and_dry_run_help_print_the_planners_flags(capsys):
    assert main(["search", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("--gpus", "--hardware", "--no-dry-run-check", "--help-model"))
    assert main(["dry-run", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("--world-size", "--hardware", "--trainer", "--help-model"))
    assert main(["dry-run", "--help-model"]) == 0
    assert "--tensor-model-parallel-size" in capsys.readouterr().out


def test_a_tie_names_its_tie_break_and_a_loss_names_a_term_that_differs():
    config = parse_config(DENSE)
    _, candidates = search(config, 4, H100)
    explain_losses(candidates)
    fitting = [c for c in candidates if c.fits]
    best = fitting[0]
    ties = [c for c in fitting[1:] if round(c.prediction.step_s, 9) == round(best.prediction.step_s, 9)]
    slower = [c for c in fitting[1:] if c not in ties]
    assert slower
    for candidate in ties:
        assert candidate.lost_to.startswith("tie with 1.") and "tie-break" in candidate.lost_to
    for candidate in slower:
        term = candidate.lost_to.split(" +")[0]
        assert candidate.prediction.terms[term] > best.prediction.terms[term]
        assert loss_reason(candidate, best) == candidate.lost_to


def test_the_trainer_decides_what_a_no_effect_flag_is_worth():
    # --tp-comm-overlap: nothing here (no userbuffers), hidden TP under Megatron-LM (Bridge's rows)
    flags = [*DENSE, "--tensor-model-parallel-size", "2", "--sequence-parallel", "--tp-comm-overlap", "--bf16"]
    parsed = parse_arguments(flags)
    counts = search(parsed.config, 4, H100)[0]
    here = layout_of_config(parsed.config.model, parsed.config.parallel, parsed.config.training, parsed.config.zero, parsed.config.activations, 4, counts, "pretrain_gpt.py", parsed.harvested)
    megatron = layout_of_config(parsed.config.model, parsed.config.parallel, parsed.config.training, parsed.config.zero, parsed.config.activations, 4, counts, "megatron-lm", parsed.harvested)
    assert not here.tp_comm_overlap and megatron.tp_comm_overlap


def test_with_the_check_on_every_printed_pick_is_one_the_dry_run_planned_and_fit(capsys):
    assert main(["search", *DENSE, "--gpus", "4", "--hardware", "h100-sxm", "--top", "3", "--max-dry-runs", "1"]) == 0
    out = capsys.readouterr().out
    picks = [line for line in out.splitlines() if line[:3] in ("1. ", "2. ", "3. ")]
    assert len(picks) == 1 and "dry run" in picks[0] and "not checked" not in out
    assert "stopped at --max-dry-runs 1" in out


def test_the_users_data_and_checkpoint_flags_reach_the_command_and_several_nodes_get_the_multi_node_launcher(capsys):
    from planner.layout_flags import launch_command

    data = ["--data-path", "corpus_text_document", "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096",
            "--save", "checkpoints/run1"]
    assert main(["search", *DENSE, *data, "--gpus", "4", "--hardware", "h100-sxm", "--no-dry-run-check",
                 "--top", "1"]) == 0
    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if line.startswith("   torchrun"))
    assert shlex.join(data) in command and "as printed" not in out
    assert launch_command(16, 8, ["--bf16"]) == "NNODES=2 GPUS_PER_NODE=8 scripts/launch_multi_node.sh --bf16"


def test_the_search_counts_the_mlp_width_the_model_builds():
    """A SwiGLU model without --ffn-hidden-size (llama-tiny, as a Megatron launch without the flag) builds Megatron's
    int(4h x 2/3 / 64) x 64 wide MLP; the search's activations and the bounds' largest tensor read that width, not
    4h."""
    import torch

    from arguments.bounds import largest_tensor
    from gpt.model import GPTModel
    from parallel.state import ParallelState
    from planner.layout_perf import model_counts

    config = parse_config([*DENSE, "--vocab-size", "256"])
    model = GPTModel(config.model, ParallelState(device=torch.device("meta")))
    width = dict(model.named_parameters())["blocks.0.mlp.dense_h_to_4h_up.weight"].shape[0]
    assert width == 320 != 4 * config.model.hidden_size
    assert model_counts(config.model).gated_width_dense == width
    micro, seq = config.training.micro_batch_size, config.model.seq_length
    assert largest_tensor(config)[0] == max(micro * seq * width, micro * seq * 256, config.model.seq_length * 128,
                                            width * 128)
