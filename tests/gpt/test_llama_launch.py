"""A Llama-shaped launch through the flags Megatron uses (issue 37): Megatron-LM's spellings
(`--normalization RMSNorm` and, as NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh's MODEL_ARGS
give them, `--swiglu --position-embedding-type rope --group-query-attention --num-query-groups N
--untie-embeddings-and-output-weights --disable-bias-linear`) and Megatron-DeepSpeed's (`--normalization rmsnorm
--use-rotary-position-embeddings --no-position-embedding --num-key-value-heads N`, as in
deepspeedai/Megatron-DeepSpeed examples_deepspeed/pretrain_llama2_distributed.sh) train the same model:
pretrain_gpt.main runs 3 iterations on a CPU with equal losses, and they are not GPT-2's."""

import math

from tests.reliability_helpers import metrics_records, train

SHAPE = ["--num-attention-heads", "4", "--train-iters", "3", "--seed", "7"]
MEGATRON_LM = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
               "--group-query-attention", "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
               "--disable-bias-linear"]
MEGATRON_DEEPSPEED = ["--normalization", "rmsnorm", "--swiglu", "--use-rotary-position-embeddings",
                      "--no-position-embedding", "--num-key-value-heads", "2", "--untie-embeddings-and-output-weights",
                      "--disable-bias-linear"]


def losses(corpus_cache, workdir, flags) -> list[float]:
    workdir.mkdir()
    outcome = train(corpus_cache, workdir, *SHAPE, *flags)
    assert outcome.code == 0, outcome.err[-3000:]
    records = [record for record in metrics_records(workdir / "metrics.jsonl") if "loss" in record]
    assert [record["iteration"] for record in records] == [1, 2, 3]
    assert all(math.isfinite(record["loss"]) for record in records)
    return [record["loss"] for record in records]


def test_a_llama_shaped_launch_trains_under_either_programs_flags(corpus_cache, tmp_path):
    megatron_lm = losses(corpus_cache, tmp_path / "megatron-lm", MEGATRON_LM)
    assert losses(corpus_cache, tmp_path / "megatron-deepspeed", MEGATRON_DEEPSPEED) == megatron_lm
    assert losses(corpus_cache, tmp_path / "gpt2", []) != megatron_lm  # the flags changed the model


def test_megatron_lms_llama3_example_is_taken_whole_with_its_fp8_parameter_gathers():
    """NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh (the replay corpus's
    megatron-lm-llama-train-llama3-8b-h100-fp8, shrunk as tests/scripts/test_replay_corpus.py shrinks it, which
    trains it): its Llama 3 blocks (--normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base
    1000000 --group-query-attention --num-query-groups 8 --kv-channels 128 --untie-embeddings-and-output-weights
    --disable-bias-linear) are accepted, and so are --decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5 (the embedding
    and output layer's own rate, tests/zero/test_decoupled_lr.py), --split "'99,1,0'" (its unquoted array keeps
    the quotes; Megatron's parse_and_normalize_split reads the numbers with a regex,
    tests/data/test_split_as_megatron.py), --vocab-size 128256 beside its HuggingFaceTokenizer (not read, as
    in Megatron: tests/training/test_vocab_size_beside_tokenizer.py), its delayed hybrid FP8 beside --save (the amax
    histories are checkpointed) and --fp8-param-gather under its distributed optimizer (the FP8 weights gathered as
    e4m3 bytes, tests/gpt/test_fp8_param_gather.py)."""
    from arguments.parser import parse_arguments
    from tests.replay_corpus import CORPUS
    from tests.replay_corpus.shrink import LocalFiles, shrink
    from training.late_checks import LATE_CHECKS

    launch = next(launch for launch in CORPUS if launch.name == "megatron-lm-llama-train-llama3-8b-h100-fp8")
    assert launch.refusal is None
    argv = shrink(launch, LocalFiles("/nonexistent/corpus_text_document", "/nonexistent/tokenizer", 512,
                                     "/nonexistent/out")).argv
    model = parse_arguments(argv, late_checks=LATE_CHECKS).config.model
    assert (model.fp8.format, model.fp8.recipe, model.fp8.param_gather) == ("hybrid", "delayed", True)
    assert model.mlp.swiglu and model.norms.normalization == "RMSNorm" and model.positions.position_embedding_type == "rope"
    assert model.output.untie_embeddings_and_output_weights  # the sizes are the shrink's
