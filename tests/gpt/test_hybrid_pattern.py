"""--hybrid-layer-pattern read as GPT blocks (gpt/hybrid_pattern.py) and turned into the GPT settings
(arguments/megatron/hybrid_layer_pattern.py): what each pattern sets, and each refusal in one line.

The symbols and rules are Megatron-Core's (megatron/core/models/hybrid/hybrid_layer_allocation.py @ d98e8a64) and
Megatron-LM's validate_args (megatron/training/arguments.py @ d98e8a64); tests/training/test_hybrid_layer_pattern.py
trains the patterns against the GPT flags.
"""

from __future__ import annotations

import re

import pytest

from arguments.config import ConfigError
from arguments.parser import parse_arguments
from base.options import setting_values
from gpt.hybrid_pattern import parse_hybrid_pattern
from gpt.pipeline_layout import layout_chunks

MEGATRON_SPEC = ["--spec", "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]


def test_a_pattern_is_its_blocks_stages_and_mtp_depth():
    pattern = parse_hybrid_pattern("*-*E|*E*E/*E/*E")
    assert pattern.blocks == ("*-", "*E", "*E", "*E")
    assert (pattern.num_layers, pattern.megatron_layers, pattern.mtp_depth) == (4, 8, 2)
    assert pattern.moe_layer_freq() == "[0,1,1,1]"
    assert pattern.pipeline_layout() == "Ett|ttmmL"
    # Megatron's test pattern "*-"*16 (tests/unit_tests/models/test_hybrid_model.py's "*-" segments): 16 blocks
    assert parse_hybrid_pattern("*-" * 16).num_layers == 16
    # "<main>/" with nothing after it is no MTP, as parse_hybrid_pattern reads it
    assert parse_hybrid_pattern("*-*-/").mtp_depth == 0


def test_segment_k_is_chunk_k_over_pp_of_rank_k_mod_pp():
    """select_pipeline_segment: segment_index = vp_stage * pp_size + pp_rank; the layout reads its stages so."""
    pattern = parse_hybrid_pattern("*-|*-*-|*-*-*-|*-")
    chunks = layout_chunks(pattern.pipeline_layout(), 2, pattern.num_layers, 0)
    assert [[stage.count("t") for stage in rank] for rank in chunks] == [[1, 3], [2, 1]]


@pytest.mark.parametrize("argv, settings", [
    # the pattern alone sets the depth, as Megatron-LM's own tests launch `--hybrid-layer-pattern "*-"*16`
    (["--hybrid-layer-pattern", "*-" * 16], {"num_layers": 16}),
    # --num-layers may repeat the blocks, or Megatron's count of the pattern's layers
    (["--hybrid-layer-pattern", "*-*-", "--num-layers", "4"], {"num_layers": 2}),
    (["--hybrid-layer-pattern", "*-*-", "--num-layers", "2"], {"num_layers": 2}),
    (["--hybrid-layer-pattern", "*-*E*E*E", "--num-experts", "4"], {"moe_layer_freq": "[0,1,1,1]"}),
    (["--hybrid-layer-pattern", "*E*E", "--num-experts", "4"], {"moe_layer_freq": 1}),
    (["--hybrid-layer-pattern", "*-*-/*-/*-"], {"num_layers": 2, "mtp_num_layers": 2}),
    (["--hybrid-layer-pattern", "*-*-|*-*-|*-*-|*-*-", "--pipeline-model-parallel-size", "2"],
     {"num_layers": 8, "pipeline_model_parallel_layout": "Ett|tt|tt|ttL"}),
    # without `|`, --decoder-first-pipeline-num-layers counts Megatron's layers, two a block
    (["--hybrid-layer-pattern", "*-*-*-*-", "--pipeline-model-parallel-size", "2",
      "--decoder-first-pipeline-num-layers", "2"], {"decoder_first_pipeline_num_layers": 1}),
    # and its even split is of those layers: `M` alone is one, so 4 blocks then 2 (Megatron's 4 layers a stage)
    (["--hybrid-layer-pattern", "MMMM*-M-", "--pipeline-model-parallel-size", "2", "--mamba-num-groups", "1"],
     {"num_layers": 6, "pipeline_model_parallel_layout": "Etttt|ttL"}),
    (["--hybrid-layer-pattern", "M-M-M-M-", "--pipeline-model-parallel-size", "2", "--mamba-num-groups", "1"],
     {"num_layers": 4, "pipeline_model_parallel_layout": None}),
    # its deprecated spelling, and Megatron's hybrid launch flags beside it
    (["--hybrid-override-pattern", "*-*-*-", "--is-hybrid-model", *MEGATRON_SPEC], {"num_layers": 3}),
])
def test_the_pattern_sets_the_gpt_settings(argv, settings):
    config = parse_arguments(argv).config
    flat = {**setting_values(config.model), **setting_values(config.parallel)}
    assert {name: flat[name] for name in settings} == settings
    assert config.model.hybrid_layer_pattern is not None


# multi-latent attention's sizes, which `+` layers take from --multi-latent-attention's flags
MLA = ["--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
       "--v-head-dim", "8", "--position-embedding-type", "rope"]


def test_plus_is_an_mla_block_alone_or_beside_attention():
    pattern = parse_hybrid_pattern("*-+E|+-*E/*E")
    assert pattern.blocks == ("*-", "+E", "+-", "*E") and pattern.mixers() == ("*", "+", "+", "*")
    assert pattern.moe_layers() == (False, True, False, True)
    config = parse_arguments(["--hybrid-layer-pattern", "+-+E", "--num-experts", "4", *MLA]).config.model
    from gpt.layer_spec import layer_specs

    assert [(spec.mixer, spec.mlp, spec.moe and spec.moe.num_experts) for spec in layer_specs(config)] == \
        [("+", "-", None), ("+", "E", 4)]


def test_one_part_blocks_set_the_depth_in_blocks_and_stages_at_block_boundaries():
    """`*` then `|` then `-` are two blocks, as Megatron's two layers; --decoder-first-pipeline-num-layers counts
    Megatron's layers, here the blocks before that boundary."""
    assert parse_hybrid_pattern("*-*|-*-").blocks == ("*-", "*", "-", "*-")
    config = parse_arguments(["--hybrid-layer-pattern", "*--*-", "--pipeline-model-parallel-size", "2",
                              "--decoder-first-pipeline-num-layers", "3"]).config
    assert (config.model.num_layers, config.parallel.decoder_first_pipeline_num_layers) == (3, 2)


def test_without_bars_the_stages_split_megatrons_layers_evenly_not_the_blocks():
    """select_pipeline_segment (core_v0.19.0 hybrid_layer_allocation.py) gives each stage symbols / PP layers:
    `M-M--*-M` at PP 2 is `M-M-` and `-*-M`, two blocks and three, the model `M-M-|-*-M` builds."""
    def layout(pattern):
        return parse_arguments(["--hybrid-layer-pattern", pattern, "--pipeline-model-parallel-size", "2",
                                "--mamba-head-dim", "8", "--mamba-num-groups", "2"]).config.parallel

    split, marked = layout("M-M--*-M"), layout("M-M-|-*-M")
    assert split.pipeline_model_parallel_layout == marked.pipeline_model_parallel_layout == "Ett|tttL"
    assert layout("M-M-*-*-").pipeline_model_parallel_layout is None  # two blocks a stage: the even block split
    # 7 layers do not split over 2 stages: refused as Megatron-LM refuses it, though the 4 blocks would split
    with pytest.raises(ConfigError, match="Megatron's even split of its 7 layers"):
        layout("M-M-*-M")


def test_g_is_a_gated_delta_net_block_beside_attention():
    """Qwen3-Next's layers: Gated DeltaNet then its MLP or MoE (`G-`, `GE`), attention between."""
    pattern = parse_hybrid_pattern("G-GE*E")
    assert pattern.blocks == ("G-", "GE", "*E") and pattern.mixers() == ("G", "G", "*")
    config = parse_arguments(["--hybrid-layer-pattern", "G-GE*E", "--num-experts", "4", "--swiglu"]).config.model
    from gpt.layer_spec import layer_specs

    assert [(spec.mixer, spec.mlp) for spec in layer_specs(config)] == [("G", "-"), ("G", "E"), ("*", "E")]
    # a `G` without its MLP is a one-part block, as any mixer alone
    config = parse_arguments(["--hybrid-layer-pattern", "G*-", "--swiglu"]).config.model
    assert [(spec.mixer, spec.mlp) for spec in layer_specs(config)] == [("G", None), ("*", "-")]


def test_mamba_and_gated_delta_net_share_one_model():
    """`M` and `G` are two mixers of the one block structure: `M-G*-GE` is four blocks, the `G` after `M-` alone,
    and the model builds each block's mixer by its symbol and runs."""
    import torch

    from gpt.gated_delta_net import GatedDeltaNet
    from gpt.layer_spec import layer_specs
    from gpt.mamba import MambaMixer
    from gpt.model import build_gpt_model
    from parallel.state import ParallelState

    config = parse_arguments([
        "--hybrid-layer-pattern", "M-G*-GE", "--num-experts", "2", "--swiglu", "--mamba-head-dim", "8",
        "--mamba-num-groups", "2", "--mamba-state-dim", "8", "--linear-num-key-heads", "2", "--linear-num-value-heads",
        "4", "--linear-key-head-dim", "8", "--linear-value-head-dim", "8", "--hidden-size", "32",
        "--num-attention-heads", "4", "--seq-length", "16", "--max-position-embeddings", "16",
        "--vocab-size", "64"]).config.model
    assert [(spec.mixer, spec.mlp) for spec in layer_specs(config)] == [("M", "-"), ("G", None), ("*", "-"), ("G", "E")]
    model = build_gpt_model(config, ParallelState(device=torch.device("cpu")), seed=1)
    assert [type(block.attention) for block in model.blocks][:2] == [MambaMixer, GatedDeltaNet]
    hidden = model.hidden_states(torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0)))
    assert hidden.shape == (2, 16, 32) and torch.isfinite(hidden).all()


def test_the_gdn_variant_beside_a_pattern_is_said_not_read_as_hybrid_model_reads_symbols():
    """Megatron-Core 0.19's HybridModel builds its layers from the pattern's symbols (hybrid_layer_specs.py); the
    variant and --linear-attention-freq choose layers only in GPTModel's experimental specs."""
    from gpt.layer_spec import layer_specs

    gdn = ["--linear-num-key-heads", "2", "--linear-num-value-heads", "4", "--linear-key-head-dim", "8",
           "--linear-value-head-dim", "8", "--swiglu", "--hidden-size", "32", "--num-attention-heads", "4"]
    parsed = parse_arguments(["--hybrid-layer-pattern", "*-G-", "--experimental-attention-variant",
                              "gated_delta_net", "--linear-attention-freq", "2", *gdn])
    assert [spec.mixer for spec in layer_specs(parsed.config.model)] == ["*", "G"]
    assert any("--experimental-attention-variant gated_delta_net: not read beside --hybrid-layer-pattern" in note
               for note in parsed.notes), parsed.notes


def test_a_mix_of_attention_and_mla_is_said_at_start_up_as_megatron_refuses_it():
    notes = parse_arguments(["--hybrid-layer-pattern", "*-+-", *MLA]).notes
    assert any("which Megatron-LM refuses" in note for note in notes), notes
    assert not any("Megatron-LM refuses" in note
                   for note in parse_arguments(["--hybrid-layer-pattern", "+-+-", *MLA]).notes)


ONE_GROUP = ["--group-query-attention", "--num-query-groups", "1", "--seq-length", "64", "--max-position-embeddings",
             "64", "--micro-batch-size", "1", "--global-batch-size", "4"]
GROUP_CHECKS = {  # what reads an attention layer's query groups, and its refusal
    "a2a+p2p": (["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes",
                 "2", "2"], "1 key/value groups over the all-to-all level's 2 ranks"),
    "muon qkv split": (["--optimizer", "muon", "--tensor-model-parallel-size", "2"],
                       "--num-query-groups 1 below --tensor-model-parallel-size 2"),
}


@pytest.mark.parametrize("check", GROUP_CHECKS)
def test_the_attention_layers_of_a_mixed_pattern_have_their_query_groups_checked(check):
    """An MLA layer's key heads are its query heads, an attention layer's its --num-query-groups: the checks read
    each layer's mixer, so `*-+-` is refused where its `*` layers' one group cannot be split, and `+-+-` is not."""
    extra, refusal = GROUP_CHECKS[check]
    parse_arguments(["--hybrid-layer-pattern", "+-+-", *MLA, *ONE_GROUP, *extra])
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        parse_arguments(["--hybrid-layer-pattern", "*-+-", *MLA, *ONE_GROUP, *extra])


REFUSED = {
    # Megatron-Core's GatedDeltaNet runs its conv and gate through the MLP's activation, SiLU only in its kernels
    "gated deltanet without swiglu": (["--hybrid-layer-pattern", "G-*-"], "add --swiglu"),
    "deepseek sparse attention": (["--hybrid-layer-pattern", "*-D-"],
                                  "`D` (DeepSeek sparse attention (DSA)) layers are not built here"),
    # Megatron-LM builds MLATransformerConfig, whose sizes `+` layers read, only under --multi-latent-attention
    # (megatron/training/arguments.py core_transformer_config_from_args: `if args.multi_latent_attention:
    # config_class = MLATransformerConfig`); without it MLASelfAttention finds no q_lora_rank
    "mla without its flag": (["--hybrid-layer-pattern", "+-+-"], "its `+` (MLA) layers need --multi-latent-attention"),
    "mla flag without plus": (["--hybrid-layer-pattern", "*-*-", *MLA],
                              "--multi-latent-attention beside a pattern without `+`"),
    "unknown symbol": (["--hybrid-layer-pattern", "*-x-"], "'x' is not a layer symbol"),
    "unequal mtp": (["--hybrid-layer-pattern", "*-*E/*E/*-", "--num-experts", "4"], "the MTP patterns after `/` differ"),
    "mtp of another kind": (["--hybrid-layer-pattern", "*-*-/*E", "--num-experts", "4"],
                            "an MTP layer here is a block of the last decoder layer's kind"),
    "mtp of two blocks": (["--hybrid-layer-pattern", "*-*-/*-*-"], "the MTP pattern '*-*-' is not one attention or GDN block"),
    "even split inside a pair": (["--hybrid-layer-pattern", "*--*-", "--pipeline-model-parallel-size", "2",
                                  "--decoder-first-pipeline-num-layers", "1"], "ends the stage inside a block"),
    "segments over pp": (["--hybrid-layer-pattern", "*-*-|*-*-|*-*-", "--pipeline-model-parallel-size", "2"],
                         "3 pipeline segments, not a multiple of --pipeline-model-parallel-size 2"),
    # Megatron's even split of its 6 layers would end a stage inside a block, and the 3 blocks do not split either
    "even split inside a block": (["--hybrid-layer-pattern", "*-*-*-", "--pipeline-model-parallel-size", "2"],
                                  "--num-layers 3 is not divisible by --pipeline-model-parallel-size 2"),
    # the blocks split evenly (2 and 2), Megatron's 6 layers (3 a stage) inside the second `M-`
    "symbol split inside a block": (["--hybrid-layer-pattern", "M-M-MM", "--pipeline-model-parallel-size", "2",
                                    "--mamba-num-groups", "1"], "ends a stage inside a block"),
    "num layers": (["--hybrid-layer-pattern", "*-*-", "--num-layers", "3"], "not --num-layers 3: drop --num-layers"),
    "mtp num layers": (["--hybrid-layer-pattern", "*-*-/*-", "--mtp-num-layers", "2"],
                       "1 MTP layers (one block after each `/`), not --mtp-num-layers 2"),
    "moe without experts": (["--hybrid-layer-pattern", "*-*E"], "its `E` (MoE) layers need --num-experts"),
    "moe layer freq": (["--hybrid-layer-pattern", "*-*E", "--num-experts", "4", "--moe-layer-freq", "1"],
                       "its MoE blocks are [0,1], not --moe-layer-freq 1"),
    "layout beside": (["--hybrid-layer-pattern", "*-*-", "--pipeline-model-parallel-size", "2",
                       "--pipeline-model-parallel-layout", "Et|tL"], "--pipeline-model-parallel-layout beside the"),
    "both spellings": (["--hybrid-layer-pattern", "*-", "--hybrid-override-pattern", "*-"],
                       "--hybrid-override-pattern with --hybrid-layer-pattern: give one"),
    "odd first stage": (["--hybrid-layer-pattern", "*-*-", "--pipeline-model-parallel-size", "2",
                         "--decoder-first-pipeline-num-layers", "1"], "ends the stage inside a block"),
    "other spec": (["--hybrid-layer-pattern", "*-", "--spec", "local"], "--spec local: not implemented"),
    "hybrid model without a pattern": (["--is-hybrid-model"], "give the pattern"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_each_refusal_is_one_line(name):
    argv, words = REFUSED[name]
    with pytest.raises(ConfigError) as refused:
        parse_arguments(argv)
    message = str(refused.value)
    assert "\n" not in message and "problems:" not in message, message  # one line, one problem
    assert words in message, message


@pytest.mark.parametrize("symbol, family", [("D", "DeepSeek sparse attention (DSA)")])
def test_pretrain_hybrid_refuses_a_layer_family_not_built_in_one_line_exit_2(symbol, family):
    """Through the command line (base.errors.run_tool): one line on stderr naming the symbol, exit 2."""
    import pretrain_hybrid
    from tests.reliability_helpers import run_main

    outcome = run_main(pretrain_hybrid.main, ["--hybrid-layer-pattern", f"*-{symbol}-", "--device", "cpu"])
    lines = outcome.err.strip().splitlines()
    assert outcome.code == 2 and len(lines) == 1 and "Traceback" not in outcome.err, outcome.err
    assert f"`{symbol}` ({family}) layers are not built here" in lines[0]
