"""Megatron-LM's CUDA graph flags, read as Megatron-LM reads them (arguments/cuda_graphs.py, arguments/megatron/
cuda_graph_flags.py). Each case cites the code it follows, in NVIDIA/Megatron-LM at d98e8a64 (the harvested "megatron-lm"
source; core_v0.16.1 alike where said):

- megatron/training/arguments.py validate_args: --enable-cuda-graph / --external-cuda-graph (deprecated spellings of
  --cuda-graph-impl local / transformer_engine, asserted apart from it and from each other), --cuda-graph-scope
  (deprecated, moved to --cuda-graph-modules, asserted apart from it), full_iteration's
  --no-check-for-nan-in-loss-and-grad;
- megatron/core/transformer/cuda_graph_config.py: "full", "full_iteration", "full_iteration_inference";
- megatron/core/transformer/transformer_config.py __post_init__: local's moe_router/moe_preprocess pair, the MoE
  scopes, full recompute, selective recompute with dropout inside the graphs;
- megatron/training/training.py: --optimizer-cuda-graph's OptimizerCudaGraphWrapper (accepted with no effect here).

What is not captured here and changes no number is not refused (tests/training/test_cuda_graphs.py).
"""

from __future__ import annotations

import pytest

from arguments.megatron.flags import NO_EFFECT_LINE
from arguments.parser import parse_arguments
from base.errors import ConfigError
from training.late_checks import LATE_CHECKS

MOE = ["--num-experts", "4", "--moe-router-topk", "2"]
DROP_AND_PAD = ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"]


def settings(*argv: str) -> tuple[str, list[str], list[str]]:
    parsed = parse_arguments(list(argv))
    training = parsed.config.training
    return training.cuda_graph_impl, list(training.cuda_graph_modules), [note for note in parsed.notes if "cuda" in note]


def refusal(*argv: str, late: bool = False) -> str:
    with pytest.raises(ConfigError) as error:
        parse_arguments(list(argv), late_checks=LATE_CHECKS if late else ())
    return str(error.value)


def test_the_defaults_are_megatrons():
    # TransformerConfig: cuda_graph_impl "none", cuda_graph_warmup_steps 3; arguments.py: --cuda-graph-modules []
    parsed = parse_arguments([])
    assert (parsed.config.training.cuda_graph_impl, parsed.config.training.cuda_graph_modules,
            parsed.config.training.cuda_graph_warmup_steps) == ("none", [], 3)
    # a Megatron flags launch takes Megatron's defaults from its argument files: the empty list is written as none
    flags_launch = parse_arguments(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                    "--cuda-graph-impl", "local"])
    assert flags_launch.config.training.cuda_graph_modules == [] and flags_launch.config.training.cuda_graph_warmup_steps == 3


def test_the_deprecated_impl_switches_are_local_and_transformer_engine_with_megatrons_warning():
    # validate_args: `if args.enable_cuda_graph: ... args.cuda_graph_impl = "local"`, and "transformer_engine" for
    # --external-cuda-graph, each after print_rank_0 of its deprecation
    assert settings("--enable-cuda-graph") == ("local", [], [
        "> --enable-cuda-graph: Megatron-LM's warning: --enable-cuda-graph is deprecated, use --cuda-graph-impl=local "
        "instead."])
    impl, _, notes = settings("--external-cuda-graph")
    assert impl == "transformer_engine" and "--external-cuda-graph is deprecated, use " \
                                           "--cuda-graph-impl=transformer_engine instead." in notes[0]
    # `assert args.cuda_graph_impl == "none", "Do not use --enable-cuda-graph or --external-cuda-graph with
    # --cuda-graph-impl."` and `assert not args.enable_cuda_graph or not args.external_cuda_graph`
    assert "Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl." in refusal(
        "--enable-cuda-graph", "--cuda-graph-impl", "transformer_engine")
    assert "cannot be enabled at the same time" in refusal("--enable-cuda-graph", "--external-cuda-graph")


def test_the_deprecated_scope_is_the_modules_and_not_beside_them():
    # validate_args: `args.cuda_graph_modules = args.cuda_graph_scope_deprecated` after warn_rank_0, unless
    # --cuda-graph-modules is given too ("--cuda-graph-scope and --cuda-graph-modules cannot be used together.")
    impl, modules, notes = settings("--cuda-graph-impl", "local", "--cuda-graph-scope", "attn", "mlp")
    assert (impl, modules) == ("local", ["attn", "mlp"])
    assert notes == ["> --cuda-graph-scope: Megatron-LM's warning: --cuda-graph-scope is deprecated, use "
                     "--cuda-graph-modules instead."]
    assert "cannot be used together" in refusal("--cuda-graph-impl", "local", "--cuda-graph-scope", "attn",
                                                 "--cuda-graph-modules", "mlp")
    # core_v0.15.0's single-valued --cuda-graph-scope {full,attn,full_iteration} (default full: the whole layer)
    assert settings("--enable-cuda-graph", "--cuda-graph-scope", "full")[:2] == ("local", [])


def test_full_is_the_whole_layer_alone():
    # cuda_graph_config.py normalize_cuda_graph_modules: `if "full" in raw_scopes: assert raw_scopes == ["full"]`,
    # then []; validate_args warns "full scope is deprecated. Use empty cuda_graph_modules to capture the whole layer."
    impl, modules, notes = settings("--cuda-graph-impl", "local", "--cuda-graph-modules", "full")
    assert (impl, modules) == ("local", []) and "full scope is deprecated" in notes[0]
    assert "full scope cannot be used with other scopes" in refusal("--cuda-graph-impl", "local",
                                                                    "--cuda-graph-modules", "full", "attn")


def test_full_iteration_moves_to_the_impl_and_asks_what_megatron_asks():
    # CUDA_GRAPH_MODULES_DEPRECATIONS: 'full_iteration' -> ('cuda_graph_impl', 'full_iteration'), allowed beside
    # none, local or full_iteration; validate_args then asserts --no-check-for-nan-in-loss-and-grad
    impl, modules, notes = settings("--cuda-graph-impl", "local", "--cuda-graph-modules", "full_iteration",
                                    "--no-check-for-nan-in-loss-and-grad")
    assert (impl, modules) == ("full_iteration", []) and "Setting --cuda-graph-impl=full_iteration instead" in notes[0]
    assert "--no-check-for-nan-in-loss-and-grad should be set" in refusal("--cuda-graph-impl", "full_iteration")
    assert "cannot be combined with --cuda-graph-impl transformer_engine" in refusal(
        "--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "full_iteration")
    # `assert not (args.cuda_graph_impl == "full_iteration" and args.cuda_graph_modules)`
    assert "must be empty when --cuda-graph-impl=full_iteration" in refusal(
        "--cuda-graph-impl", "full_iteration", "--cuda-graph-modules", "attn", "--no-check-for-nan-in-loss-and-grad")
    # 'full_iteration_inference' is an inference scope: nothing for training
    impl, modules, notes = settings("--cuda-graph-impl", "local", "--cuda-graph-modules", "full_iteration_inference")
    assert (impl, modules) == ("local", []) and "no effect on training" in notes[0]


def test_the_inference_scope_must_fit_the_impl_as_megatron_asserts():
    # cuda_graph_config.py ALLOWED_INFERENCE_SCOPES: local takes layer or block, the others none
    assert "invalid inference CUDA graph scope" in refusal("--cuda-graph-impl", "transformer_engine",
                                                           "--inference-cuda-graph-scope", "layer")
    assert "invalid inference CUDA graph scope" in refusal("--inference-cuda-graph-scope", "block")
    assert settings("--cuda-graph-impl", "local", "--inference-cuda-graph-scope", "block")[0] == "local"
    # validate_deprecated_cuda_graph_modules_migration_inputs
    assert "cannot be combined" in refusal("--cuda-graph-impl", "local", "--cuda-graph-modules",
                                           "full_iteration_inference", "--inference-cuda-graph-scope", "layer")


def test_the_moe_scopes_follow_transformer_config():
    # local: "doesn't currently distinguish between moe_preprocess or moe_router so just set both"
    assert settings("--cuda-graph-impl", "local", "--cuda-graph-modules", "moe_router", *MOE)[1] == \
        ["moe_router", "moe_preprocess"]
    assert "moe_preprocess cuda graph is only supported with moe_router" in refusal(
        "--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "moe_preprocess", *MOE)
    assert "must not contain both moe and moe_router" in refusal(
        "--cuda-graph-impl", "local", "--cuda-graph-modules", "moe", "moe_router", *MOE, *DROP_AND_PAD)
    assert "moe cuda graph is only supported for MoE" in refusal("--cuda-graph-impl", "local",
                                                                 "--cuda-graph-modules", "moe")
    assert "mlp cuda graph is only supported for dense layers" in refusal(
        "--cuda-graph-impl", "local", "--cuda-graph-modules", "mlp", *MOE)
    assert "only supported with drop-padding MoE" in refusal("--cuda-graph-impl", "local", "--cuda-graph-modules",
                                                             "moe", *MOE)
    assert "DtoH copies and synchronizations in the preprocess step" in refusal(
        "--cuda-graph-impl", "local", "--cuda-graph-modules", "moe_router", *MOE, "--moe-expert-capacity-factor", "1.0",
        "--moe-token-dispatcher-type", "alltoall")
    # accepted: drop-and-pad MoE with moe; attn and mlp beside MoE layers where some are dense
    assert settings("--cuda-graph-impl", "local", "--cuda-graph-modules", "moe", *MOE, *DROP_AND_PAD)[1] == ["moe"]
    assert settings("--cuda-graph-impl", "local", "--cuda-graph-modules", "attn", "mlp", *MOE, "--num-layers", "4",
                    "--moe-layer-freq", "[0,1,0,1]")[1] == ["attn", "mlp"]


def test_recompute_inside_the_graphs_is_refused_as_megatron_refuses_it():
    # "full recompute is only supported with full iteration CUDA graph."
    for recompute in (["--checkpoint-activations"], ["--recompute-granularity", "full"]):
        assert "full recompute is only supported with full iteration CUDA graph" in refusal(
            "--cuda-graph-impl", "local", *recompute)
    assert settings("--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad",
                    "--recompute-granularity", "full")[0] == "full_iteration"
    # selective recompute: "attention dropout is not supported with graphed attention recomputation." (core_attn is
    # the default recompute module), and hidden dropout with mlp recomputed inside an mlp graph
    assert "attention dropout is not supported with graphed attention recomputation" in refusal(
        "--cuda-graph-impl", "local", "--recompute-activations", "--attention-dropout", "0.1")
    assert "hidden dropout is not supported with graphed MLP/MoE recomputation" in refusal(
        "--cuda-graph-impl", "local", "--cuda-graph-modules", "mlp", "--recompute-granularity", "selective",
        "--recompute-modules", "mlp", "--hidden-dropout", "0.1")
    # outside the graphs' scope, or without dropout, it stands
    assert settings("--cuda-graph-impl", "local", "--cuda-graph-modules", "mlp", "--recompute-activations",
                    "--attention-dropout", "0.1")[0] == "local"
    assert settings("--cuda-graph-impl", "local", "--recompute-activations", "--attention-dropout", "0")[0] == "local"


def test_the_optimizer_graph_is_accepted_with_its_reason():
    notes = parse_arguments(["--optimizer-cuda-graph"]).notes
    line = next(note for note in notes if note.startswith(NO_EFFECT_LINE))
    assert "--optimizer-cuda-graph (Megatron-LM's CUDA graph of the optimizer step (OptimizerCudaGraphWrapper" in line


def test_warmup_steps_are_not_negative_and_expandable_segments_need_nccl_graph_registration_off(monkeypatch):
    assert "--cuda-graph-warmup-steps -1 must be 0 or more" in refusal("--cuda-graph-warmup-steps", "-1")
    # validate_args for transformer_engine (CudaGraphManager for local, on a GPU before compute capability 10)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    assert "Setting NCCL_GRAPH_REGISTER=0 to avoid illegal memory access" in refusal(
        "--cuda-graph-impl", "transformer_engine", late=True)
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")
    parse_arguments(["--cuda-graph-impl", "transformer_engine"], late_checks=LATE_CHECKS)
