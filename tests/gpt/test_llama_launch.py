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


def test_megatron_lms_llama3_example_is_refused_only_for_what_it_lacks_beside_the_blocks():
    """NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh (the replay corpus's
    megatron-lm-llama-train-llama3-8b-h100-fp8, shrunk as tests/scripts/test_replay_corpus.py shrinks it):
    its Llama 3 blocks (--normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base 1000000
    --group-query-attention --num-query-groups 8 --kv-channels 128 --untie-embeddings-and-output-weights
    --disable-bias-linear) are accepted, and so are --decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5 (the embedding
    and output layer's own rate, tests/zero/test_decoupled_lr.py), --split "'99,1,0'" (its unquoted array keeps
    the quotes; Megatron's parse_and_normalize_split reads the numbers with a regex,
    tests/data/test_split_as_megatron.py) and --vocab-size 128256 beside its HuggingFaceTokenizer (not read, as
    in Megatron: tests/training/test_vocab_size_beside_tokenizer.py); what it is refused for is what this
    program lacks: FP8 parameter all-gathers (its delayed FP8 recipe beside --save is taken since the amax histories
    are checkpointed, docs/fp8.md; its --sequence-parallel exists: tests/parallel/test_sequence_parallel.py)."""
    import pytest

    from arguments.parser import parse_arguments
    from base.errors import ConfigError
    from tests.replay_corpus import CORPUS
    from tests.replay_corpus.shrink import LocalFiles, shrink
    from training.late_checks import LATE_CHECKS

    launch = next(launch for launch in CORPUS if launch.name == "megatron-lm-llama-train-llama3-8b-h100-fp8")
    argv = shrink(launch, LocalFiles("/nonexistent/corpus_text_document", "/nonexistent/tokenizer", 512,
                                     "/nonexistent/out")).argv
    with pytest.raises(ConfigError) as error:
        parse_arguments(argv, late_checks=LATE_CHECKS)
    message = str(error.value)
    assert launch.refusal in message and "--fp8-format hybrid" not in message  # only the param gather
    for accepted in ("--decoupled-lr", "--decoupled-min-lr", "--split", "--vocab-size", "--sequence-parallel"):
        assert accepted not in message, (accepted, message)
    for flag in ("--normalization", "--swiglu", "--position-embedding-type", "--rotary", "--group-query-attention",
                 "--num-query-groups", "--kv-channels", "--untie-embeddings-and-output-weights",
                 "--disable-bias-linear", "--ffn-hidden-size", "--apply-layernorm-1p"):
        assert flag not in message, (flag, message)
