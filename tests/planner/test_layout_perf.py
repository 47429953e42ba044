"""The layout model's terms (planner/layout_perf.py), each against what its source says it must do."""

import dataclasses

import pytest

from arguments.parser import parse_config
from planner.bridge_rows import HF_CONFIGS
from planner.layout_perf import Layout, LayoutConstants, model_counts, predict_layout, visible_keys_per_query
from planner.perf_model import load_hardware

HARDWARE = load_hardware("h100-sxm")
CONSTANTS = LayoutConstants(0.5, "test")


@pytest.fixture(scope="module")
def qwen():
    return model_counts(parse_config(["--init-from-hf", str(HF_CONFIGS / "qwen3-30b-a3b"), "--seq-length", "4096"]).model)


@pytest.fixture(scope="module")
def llama():
    return model_counts(parse_config(["--config", "llama3-8b"]).model)


def predict(counts, **layout):
    return predict_layout(counts, Layout(**layout), HARDWARE, CONSTANTS, HARDWARE.fp8_peak_flops)


def test_fp8_gemms_run_at_the_fp8_peak_and_attention_stays_bf16(llama):
    bf16 = predict(llama, gpus=8, global_batch_size=64)
    fp8 = predict(llama, gpus=8, global_batch_size=64, precision="fp8")
    assert fp8.terms["gemm"] / bf16.terms["gemm"] == pytest.approx(989 / 1979)  # the datasheet's two peaks
    assert fp8.terms["attention"] == bf16.terms["attention"]


def test_an_expert_group_over_two_nodes_pays_the_nic(qwen):
    one_node = predict(qwen, gpus=16, ep=8, global_batch_size=256)
    two_nodes = predict(qwen, gpus=16, ep=16, global_batch_size=256)
    assert two_nodes.terms["ep"] > 3 * one_node.terms["ep"]  # 50 GB/s across against 450 GB/s inside
    assert predict(qwen, gpus=16, global_batch_size=256).terms["ep"] == 0.0


def test_virtual_stages_divide_the_bubble_and_hide_the_sends(llama):
    plain = predict(llama, gpus=8, pp=4, global_batch_size=64)
    interleaved = predict(llama, gpus=8, pp=4, vp=2, global_batch_size=64)
    assert interleaved.terms["pp_bubble"] == pytest.approx(plain.terms["pp_bubble"] / 2)
    assert plain.terms["pp_p2p"] > 0 and interleaved.terms["pp_p2p"] == 0.0


def test_tp_overlap_hides_the_sequence_parallel_collectives_behind_the_gemms(llama):
    exposed = predict(llama, gpus=8, tp=8, global_batch_size=64)
    hidden = predict(llama, gpus=8, tp=8, global_batch_size=64, tp_comm_overlap=True)
    assert exposed.terms["tp"] > 0 and hidden.terms["tp"] < exposed.terms["tp"]


def test_recompute_costs_time_but_not_model_flops(llama):
    base = Layout(gpus=8, global_batch_size=64)
    plain = predict_layout(llama, base, HARDWARE, CONSTANTS)
    full = predict_layout(llama, dataclasses.replace(base, recompute_fraction=1.0), HARDWARE, CONSTANTS)
    assert full.step_s > plain.step_s
    assert full.model_tflops_per_gpu * full.step_s == pytest.approx(plain.model_tflops_per_gpu * plain.step_s)


def test_an_hf_model_counts_its_output_layer_with_the_launch_vocabulary(qwen):
    # An --init-from-hf config has no vocabulary until launch (planner/vocabulary.py reads the folder's):
    # without it the logits GEMM, 2 h V FLOPs per token (Megatron's num_floating_point_operations), was left out.
    config = parse_config(["--init-from-hf", str(HF_CONFIGS / "qwen3-30b-a3b"), "--seq-length", "4096"])
    with_vocab = model_counts(config.model, 151936)
    assert qwen.logits_flops_per_token == 0
    assert with_vocab.padded_vocab == 151936  # already a multiple of 128
    assert with_vocab.logits_flops_per_token == 2 * 2048 * 151936


def test_sliding_window_layers_run_only_their_windows_keys():
    # GPT-OSS 120B: every other layer a 128-token window (its folder's sliding_window, --window-size 127,0).
    seq = 4096
    counts = model_counts(parse_config(["--init-from-hf", str(HF_CONFIGS / "gpt-oss-120b"), "--seq-length", str(seq),
                                        "--max-position-embeddings", str(seq)]).model)
    window_keys = sum(min(i, 127) + 1 for i in range(seq)) / seq  # each query's visible keys, counted one by one
    expected = (18 * seq / 2 + 18 * window_keys) / (36 * seq)
    assert counts.attention_executed_flops_per_token / counts.attention_flops_per_token == pytest.approx(expected)
    assert visible_keys_per_query(seq, None) == seq / 2


def test_an_even_layer_split_leaves_the_output_layer_on_the_last_stage(llama):
    # Megatron's even split (no pipeline layout, account_for_loss_in_pipeline_split off): the last of PP stages
    # runs every token's logits on top of its blocks, and 1F1B runs at that stage's pace.
    balanced = predict(llama, gpus=8, pp=4, global_batch_size=64)
    even = predict(llama, gpus=8, pp=4, global_batch_size=64, output_stage_balanced=False)
    logits_s = 64 * 8192 * 3 * llama.logits_flops_per_token / 8 / (HARDWARE.peak_flops * CONSTANTS.gemm_efficiency)
    assert balanced.terms["pp_output_stage"] == 0.0
    assert even.terms["pp_output_stage"] == pytest.approx(3 * logits_s)
    assert predict(llama, gpus=8, global_batch_size=64, output_stage_balanced=False).terms["pp_output_stage"] == 0.0


def test_ranks_sharing_cores_lose_nothing_to_a_pipelines_waits(llama):
    # 4 ranks on 2 cores (configs/hardware/cpu-2core-4proc.yaml): at PP 2 one stage's 2 ranks fill both cores while
    # the other waits, so neither the bubble nor a lighter stage's wait idles a core; at PP 4 one rank would
    # leave a core idle, and with a core per rank (a GPU profile) every wait is paid.
    cpu = load_hardware("cpu-2core-4proc")
    shared = dict(gpus=4, pp=2, global_batch_size=8, stage_counts=((20,), (12,)))
    on_cpu = predict_layout(llama, Layout(**shared), cpu, CONSTANTS)
    on_gpu = predict_layout(llama, Layout(**shared), dataclasses.replace(cpu, cores_per_node=None), CONSTANTS)
    assert on_cpu.terms["pp_bubble"] == on_cpu.terms["pp_output_stage"] == 0.0
    assert on_gpu.terms["pp_bubble"] > 0 and on_gpu.terms["pp_output_stage"] > 0
    assert on_cpu.terms["gemm"] == on_gpu.terms["gemm"]
    deep = predict_layout(llama, Layout(gpus=4, pp=4, global_batch_size=8, stage_counts=((8,),) * 4), cpu, CONSTANTS)
    assert deep.terms["pp_bubble"] > 0


def test_a_pattern_mixing_attention_and_mla_counts_each_layers_mixer():
    """`*-+-*-+-`: half the layers attention, half MLA. The CP ring's keys and values per token are the layers'
    mean (attention 4 heads x 2 x 64, MLA 4 heads x (48 + 64)), its attention FLOPs and MLA's up-projections the
    two models' halves, where it counted every layer as MLA (the flag --multi-latent-attention)."""
    mla = ["--multi-latent-attention", "--kv-lora-rank", "32", "--qk-head-dim", "32", "--qk-pos-emb-head-dim", "16",
           "--v-head-dim", "64"]
    base = ["--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "256", "--max-position-embeddings",
            "256", "--vocab-size", "512", "--position-embedding-type", "rope"]
    attention, all_mla, mixed = (model_counts(parse_config([*base, *flags]).model) for flags in (
        ["--num-layers", "4"], ["--num-layers", "4", *mla], ["--hybrid-layer-pattern", "*-+-*-+-", *mla]))
    assert (attention.kv_width, all_mla.kv_width, mixed.kv_width) == (512, 448, 480)
    for name in ("attention_flops_per_token", "blocks_flops_per_token", "mla_up_flops_per_token",
                 "mlp_flops_per_token", "dense_parameters"):
        assert getattr(mixed, name) == (getattr(attention, name) + getattr(all_mla, name)) / 2, name
    assert mixed.block_dense_parameters == attention.block_dense_parameters  # the larger block, attention's
