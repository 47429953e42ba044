"""Issue 63's block features under tensor (with sequence), pipeline and ZeRO 1-3 parallelism: fp32 losses of 5
iterations equal the single-process run's within 1e-6 relative.

Two models carry every new feature (arguments from the command line, no folder): Gemma 3's blocks with more
(GeGLU, --apply-layernorm-1p, norms on each sublayer's input and output, scaled embeddings, per-head q/k norms,
--softmax-scale, both soft-cappings, alternating sliding windows with a local rotary base, linear rotary
interpolation, and further partial rotary, q/k/v biases, head width 24 at hidden 64 / 4 heads, grouped-query
attention, an untied output), run at TP 2 x DP 2 with --sequence-parallel and ZeRO-3, and at PP 2 x DP 2 with
ZeRO-1; and OLMo 2's (norms on the sublayers' output, q/k norms over the whole projections, whose statistics TP
sums), with Phi-3's LongRoPE for its positions, at TP 2 x DP 2 with --sequence-parallel and ZeRO-2."""

import pytest

from tests.training.test_tensor_parallel_training import NO_DROPOUT, losses, train

FIVE = ["--train-iters", "5", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
        "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--norm-epsilon", "1e-6"]
GEMMA_AND_MORE = [*FIVE, "--gated-linear-unit", "--activation", "gelu_tanh", "--ffn-hidden-size", "96",
                  "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "24", "--add-qkv-bias",
                  "--qk-layernorm", "--apply-layernorm-1p", "--sublayer-norms", "input_and_output",
                  "--scale-embeddings-by-sqrt-hidden", "--softmax-scale", "0.2", "--attn-logit-softcapping", "20",
                  "--final-logit-softcapping", "30", "--window-size", "7,0", "--window-attn-skip-freq", "2",
                  "--local-rotary-base", "500", "--rotary-seq-len-interpolation-factor", "2", "--rotary-percent",
                  "0.5"]
# with Phi-3's LongRoPE in rope's place: an original context of 16 under the 32-token sequence (its long factors)
LONGROPE = ["--position-embedding-type", "longrope", "--longrope-short-factor", "1,1.2,1.5,2,3,5,8,13",
            "--longrope-long-factor", "1.1,1.7,2.5,4,6.5,10,16,25", "--longrope-original-max-position-embeddings", "16"]
OLMO = [*FIVE[:FIVE.index("--position-embedding-type")], *FIVE[FIVE.index("--position-embedding-type") + 2:],
        *LONGROPE, "--swiglu", "--ffn-hidden-size", "96", "--qk-layernorm", "--qk-layernorm-over-projection",
        "--sublayer-norms", "output"]
RELATIVE = 1e-6


@pytest.mark.slow
def test_gemma_and_more_at_tp_sp_zero3_and_pp_zero1_log_the_single_process_losses(tmp_path, corpus_cache):
    flags = [*NO_DROPOUT, *GEMMA_AND_MORE]
    single = train(tmp_path, corpus_cache, "single", 1, *flags)
    assert len(single) == 5 and single[-1] < single[0]
    tensor = train(tmp_path, corpus_cache, "tp2xdp2", 4, *flags, "--tensor-model-parallel-size", "2",
                   "--sequence-parallel", "--zero-stage", "3")
    pipeline = train(tmp_path, corpus_cache, "pp2xdp2", 4, *flags, "--pipeline-model-parallel-size", "2",
                     "--zero-stage", "1")
    assert tensor == pytest.approx(single, rel=RELATIVE)
    assert pipeline == pytest.approx(single, rel=RELATIVE)
    assert losses(tmp_path / "tp2xdp2.jsonl", "grad_norm") == pytest.approx(
        losses(tmp_path / "single.jsonl", "grad_norm"), rel=1e-5)


@pytest.mark.slow
def test_olmo2s_blocks_with_longrope_at_tp_sp_zero2_log_the_single_process_losses(tmp_path, corpus_cache):
    flags = [*NO_DROPOUT, *OLMO]
    single = train(tmp_path, corpus_cache, "single", 1, *flags)
    tensor = train(tmp_path, corpus_cache, "tp2xdp2", 4, *flags, "--tensor-model-parallel-size", "2",
                   "--sequence-parallel", "--zero-stage", "2")
    assert tensor == pytest.approx(single, rel=RELATIVE)
