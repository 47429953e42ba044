"""A run resumes its own save under its own command, for every format and model kind (issue 110 item 4).

For every preset of configs/models (shrunk to a tiny model: the flags below win over the YAML, and presets that
shrink to the same model run once) and the model kinds (dense, MoE with the experts' width left to its default,
MoE with the expert bias, MLA, MTP (dense, and MoE with the expert bias), a hybrid pattern with an MoE block,
MLA + MoE, a pattern mixing MLA and attention blocks): the same argv trains 4 iterations straight, and 2 saved then 4 with --load, once with this project's
format and once with --ckpt-format torch_dist. Iterations 3 and 4 of the resumed run log the straight run's losses, bitwise (dropout
off: Megatron-LM's torch_dist carries no random streams, checkpoint/torch_dist/args.py). A kind the torch_dist writer
does not write says so in its start-up line and saves this project's format, which then resumes the same way.

Before, an MoE run saved with torch_dist without --moe-ffn-hidden-size was refused by its own command: the save
records the resolved width (Megatron-LM's validate_args sets it to --ffn-hidden-size), the resume compared the unset
flag. Megatron-LM's own MoE saves carry that width too: one resumes here without the flag.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import pretrain_gpt
from arguments.parser import PRESET_DIR, parse_config
from checkpoint.format import resolve_checkpoint
from checkpoint.torch_dist.common import is_megatron_checkpoint
from tests.reliability_helpers import metrics_records, run_main

SAVED_AT, ITERATIONS = 2, 4
BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "127", "--mock-data", "--device", "cpu", "--seed", "1",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0", "--log-interval", "1",
        "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "1", "--lr-decay-iters", str(ITERATIONS)]
MLA = ["--multi-latent-attention", "--q-lora-rank", "8", "--kv-lora-rank", "8", "--qk-head-dim", "8",
       "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8", "--position-embedding-type", "rope"]
EXPERTS = ["--num-experts", "4"]  # --moe-ffn-hidden-size left to its default, the dense MLP's width
# kind -> (its flags, the torch_dist writer's start-up line where it writes this project's format instead)
KINDS = {
    "dense": ([], None),
    "moe": (EXPERTS, None),
    "moe-expert-bias": ([*EXPERTS, "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                         "--moe-router-bias-update-rate", "0.05"], None),
    "mla": (MLA, None),
    "mtp": (["--mtp-num-layers", "1", "--position-embedding-type", "rope"], None),
    # an MoE MTP layer: its router's expert bias under its own key (mtp.layers.0.transformer_layer.)
    "mtp-moe-expert-bias": (["--mtp-num-layers", "1", "--position-embedding-type", "rope", *EXPERTS,
                             "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                             "--moe-router-bias-update-rate", "0.05"], None),
    "hybrid-moe": (["--hybrid-layer-pattern", "*-*E", *EXPERTS], None),
    # the per-head offsets as `self_attention.core_attention.softmax_offset` (DotProductAttention's, and MLA's)
    "softmax-learnable": (["--softmax-type", "learnable"], None),
    "mla-softmax-learnable": ([*MLA, "--softmax-type", "learnable"], None),
    # GPT-OSS's gated MLP: its fc1 [gate; up] read back as two halves (args quick_geglu, as --swiglu's)
    "quick-geglu": (["--quick-geglu", "--glu-linear-offset", "1"], None),
    "mla-moe": ([*MLA, *EXPERTS], None),
    # `+` (MLA) and `*` blocks in one model: HybridModel's layout, each layer under its mixer's names
    "hybrid-mla": (["--hybrid-layer-pattern", "+-*-", *MLA], None),
    "hybrid-mla-latent-norms": (["--hybrid-layer-pattern", "+-+-", *MLA, "--qk-layernorm"],
                                "multi-latent attention's latent norms (--qk-layernorm) under --hybrid-layer-pattern "
                                "(HybridModel's MLA layers build none): not written in Megatron-LM's layout here; "
                                "--save writes this project's checkpoints"),
}
# A preset's setting -> its tiny value (BASE's widths: 2 heads of 16); MLA's head widths where MLA is on
SHRUNK = {"kv_channels": "16", "num_query_groups": "1", "ffn_hidden_size": "64", "num_experts": "4",
          "moe_router_topk": "2", "moe_ffn_hidden_size": "32", "moe_shared_expert_intermediate_size": "32",
          "moe_router_num_groups": "2", "moe_router_group_topk": "1", "moe_layer_freq": "[0,1]",
          "q_lora_rank": "8", "kv_lora_rank": "8"}
MLA_HEADS = ["--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8"]


def _preset_flags(path: Path) -> list[str]:
    settings = yaml.safe_load(path.read_text()) or {}
    flags = ["--config", str(path)]
    for name, value in SHRUNK.items():
        if name in settings:
            flags += [f"--{name.replace('_', '-')}", value]
    return flags + (MLA_HEADS if settings.get("multi_latent_attention") else [])


def _preset_cases() -> dict[str, list[str]]:
    """{the first preset's name (and how many more shrink alike): its flags} for each distinct tiny model the presets
    shrink to (GPT-2's and the ZeRO paper's all to one)."""
    by_model: dict[str, tuple[list[str], list[str]]] = {}
    for path in sorted(PRESET_DIR.rglob("*.yaml")):
        flags = _preset_flags(path)
        model = repr(parse_config(BASE + flags).model)
        names, _ = by_model.setdefault(model, ([], flags))
        names.append(str(path.relative_to(PRESET_DIR).with_suffix("")))
    return {names[0] + (f"+{len(names) - 1}-alike" if len(names) > 1 else ""): flags
            for names, flags in by_model.values()}


CASES = {**{f"kind-{kind}": (flags, refused) for kind, (flags, refused) in KINDS.items()},
         **{f"preset-{names}": (flags, None) for names, flags in _preset_cases().items()}}


def _losses(metrics: Path) -> dict[int, float]:
    return {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r and "split" not in r}


def _train(argv: list, metrics: Path, iterations: int, *extra):
    outcome = run_main(pretrain_gpt.main, [*argv, "--train-iters", iterations, "--metrics-file", metrics, *extra])
    assert outcome.code == 0, outcome.err[-3000:]
    return outcome


@pytest.mark.parametrize("case", CASES)
def test_a_run_resumes_its_own_save_under_its_own_command_in_both_formats(tmp_path, case):
    flags, refused = CASES[case]
    argv = BASE + flags
    _train(argv, tmp_path / "straight.jsonl", ITERATIONS)
    straight = _losses(tmp_path / "straight.jsonl")
    assert sorted(straight) == list(range(1, ITERATIONS + 1))
    for fmt in ("ours", "torch_dist"):
        command = argv + (["--ckpt-format", "torch_dist"] if fmt == "torch_dist" else []) + \
            ["--save", tmp_path / fmt]
        metrics = tmp_path / f"{fmt}.jsonl"
        first = _train(command, metrics, SAVED_AT)
        megatron = is_megatron_checkpoint(resolve_checkpoint(tmp_path / fmt))
        if fmt == "torch_dist" and refused:
            assert f"> --ckpt-format torch_dist: {refused}" in first.out and not megatron
        else:
            assert megatron == (fmt == "torch_dist"), first.out[-2000:]
        _train(command, metrics, ITERATIONS, "--load", tmp_path / fmt)
        resumed = _losses(metrics)
        assert {i: resumed[i] for i in range(SAVED_AT + 1, ITERATIONS + 1)} == \
            {i: straight[i] for i in range(SAVED_AT + 1, ITERATIONS + 1)}, fmt


def test_megatron_lms_moe_save_resumes_without_the_experts_width_flag(tmp_path, monkeypatch):
    """Megatron-LM's Mixtral-shaped save (tests/fixtures/megatron_moe_ep2: --ffn-hidden-size 32 and
    --moe-ffn-hidden-size 32) holds in its args the width its validate_args gives the unset flag too: the same
    command without --moe-ffn-hidden-size resumes it (the width the experts are built at is the one saved) and trains
    iterations 3 and 4 to Megatron-LM's losses; another width is still refused in one line."""
    from tests.checkpoint.test_megatron_checkpoint import FIXTURES, data_workdir, megatrons_losses, our_flags

    name = "megatron_moe_ep2"
    monkeypatch.chdir(data_workdir(tmp_path))
    flags = our_flags(name)
    at = flags.index("--moe-ffn-hidden-size")
    assert flags[at + 1] == flags[flags.index("--ffn-hidden-size") + 1] == "32"
    without = flags[:at] + flags[at + 2:]
    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    common = ["--load", checkpoint, "--device", "cpu", "--log-interval", "1", "--data-cache-dir", tmp_path / "cache"]
    _train(without + common, tmp_path / "m.jsonl", 4)
    assert _losses(tmp_path / "m.jsonl") == pytest.approx(megatrons_losses(name), rel=1e-6, abs=0)
    wider = run_main(pretrain_gpt.main, flags[:at + 1] + ["48"] + flags[at + 2:] + common +
                     ["--metrics-file", tmp_path / "w.jsonl"])
    assert wider.code == 2 and "--moe-ffn-hidden-size 48 (the checkpoint's: 32)" in wider.err
    assert len(wider.err.strip().splitlines()) == 1


# More kinds than the runs above, each read back without training: the settings a torch_dist save's args hold, as a
# resume reads them, are the command's own
READ_BACK = {
    "group-query-attention": ["--group-query-attention", "--num-query-groups", "1"], "kv-channels": ["--kv-channels", "8"],
    "swiglu": ["--swiglu"], "swiglu-moe": ["--swiglu", *EXPERTS], "squared-relu": ["--squared-relu"],
    "llama-blocks": ["--normalization", "RMSNorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                     "--position-embedding-type", "rope", "--rotary-base", "500000", "--norm-epsilon", "1e-6"],
    "rope-scaling": ["--position-embedding-type", "rope", "--use-rope-scaling", "--rotary-percent", "0.5"],
    "yarn": ["--position-embedding-type", "yarn"], "qkv-bias": ["--disable-bias-linear", "--add-qkv-bias"],
    "layernorm-1p": ["--apply-layernorm-1p"], "qk-layernorm": ["--qk-layernorm"],
    "mla-default-widths": ["--multi-latent-attention", "--position-embedding-type", "rope"],
    "mla-rope": [*MLA, "--rope-type", "rope"],
    "moe-shared-gate": [*EXPERTS, "--moe-shared-expert-intermediate-size", "16", "--disable-bias-linear",
                        "--moe-shared-expert-gate"],
    "moe-groups": [*EXPERTS, "--moe-router-num-groups", "2", "--moe-router-group-topk", "1",
                   "--moe-router-topk-scaling-factor", "2.5", "--moe-router-score-function", "sigmoid"],
    "moe-top1-pre-softmax": [*EXPERTS, "--moe-router-topk", "1", "--moe-router-pre-softmax"],
    "moe-every-other": [*EXPERTS, "--moe-layer-freq", "2", "--ffn-hidden-size", "48"],
    "moe-freq-minus-one": [*EXPERTS, "--moe-layer-freq", "-1"],  # Megatron-LM's int: every layer (i % -1 == 0)
    "moe-mtp": [*EXPERTS, "--mtp-num-layers", "1", "--position-embedding-type", "rope"],
    "hybrid-mtp": ["--hybrid-layer-pattern", "*-*-/*-", "--position-embedding-type", "rope", "--swiglu"],
}


@pytest.mark.parametrize("flags", READ_BACK.values(), ids=READ_BACK)
def test_a_torch_dist_saves_args_read_back_as_the_command_that_wrote_them(flags):
    import torch

    from checkpoint.resume_model import model_differences
    from checkpoint.torch_dist.args import megatron_args
    from checkpoint.torch_dist.resume import metadata_view
    from parallel.state import ParallelState

    config = parse_config([*BASE, *flags, "--ckpt-format", "torch_dist", "--save", "unused"])
    assert config.megatron_format_unwritten() is None
    args = megatron_args(config, ParallelState(device=torch.device("cpu")), SAVED_AT, 4)
    assert model_differences(metadata_view({"iteration": SAVED_AT, "args": args}, config)["config"]["model"],
                             config.model) == []
