"""Where a launch differs from what the real pair would do, the start-up notes say so ("a silent difference is a
bug"): --fim-data's per-sample draws (Megatron-LM's GPTFIMDataset draws from one RandomState per dataset in reading
order, megatron/training/datasets/fim_dataset.py) and the residual MoE's coefficient init (DeepSpeed's
deepspeed/moe/layer.py MoE(use_residual=True) keeps torch.nn.Linear's default uniform draw)."""

from arguments.parser import parse_arguments


def test_fim_datas_per_sample_draws_are_named_at_start_up():
    notes = parse_arguments(["--fim-data"]).notes
    assert any(note.startswith("> --fim-data:") and "one stream per dataset" in note for note in notes), notes
    assert not any("--fim-data" in note for note in parse_arguments([]).notes)


def test_the_residual_moes_coefficient_init_is_named_at_start_up():
    notes = parse_arguments(["--deepspeed", "--num-experts", "4", "--mlp-type", "residual"]).notes
    assert any(note.startswith("> --mlp-type residual:") and "uniform" in note for note in notes), notes
    assert not any("--mlp-type residual" in note
                   for note in parse_arguments(["--deepspeed", "--num-experts", "4"]).notes)
