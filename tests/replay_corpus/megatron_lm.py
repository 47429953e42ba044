"""The replay corpus: NVIDIA/Megatron-LM's examples/, from 2020 to 2024. See launch.py for what an entry
holds."""

from tests.replay_corpus.launch import Launch, Source

LAUNCHES = (
    Launch(
        name="megatron-lm-2020-pretrain-gpt2",
        script=Source("NVIDIA/Megatron-LM", "examples/pretrain_gpt2.sh",
                      "ca19a8b542dd85dd095b5a025d38752e34473898"),
        program="pretrain_gpt2.py", world_size=1,
        expanded=("`python pretrain_gpt2.py` on one GPU; $DATA_PATH and $CHECKPOINT_PATH are the script's "
                  "<placeholders>"),
        argv=(
            "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--batch-size", "8",
            "--seq-length", "1024", "--max-position-embeddings", "1024", "--train-iters", "500000",
            "--lr-decay-iters", "320000", "--save", "<Specify path>", "--load", "<Specify path>",
            "--data-path", "<Specify path and file prefix>_text_document", "--vocab-file", "gpt2-vocab.json",
            "--merge-file", "gpt2-merges.txt", "--data-impl", "mmap", "--split", "949,50,1",
            "--distributed-backend", "nccl", "--lr", "0.00015", "--min-lr", "1.0e-5", "--lr-decay-style", "cosine",
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", ".01", "--checkpoint-activations",
            "--log-interval", "100", "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "10",
            "--fp16",
        ),
        outcome="trains",
    ),

    Launch(
        name="megatron-lm-2021-pretrain-gpt-distributed",
        script=Source("NVIDIA/Megatron-LM", "examples/pretrain_gpt_distributed.sh",
                      "c1e0689d92e2a5f91ef37a7adeb55d82727f1496"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("GPUS_PER_NODE=8 x NNODES=1 under torch.distributed.launch; $DATA_PATH, $CHECKPOINT_PATH: "
                  "the script's <placeholders>"),
        argv=(
            "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--micro-batch-size", "8",
            "--global-batch-size", "64", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--train-iters", "500000", "--lr-decay-iters", "320000", "--save", "<Specify path>",
            "--load", "<Specify path>", "--data-path", "<Specify path and file prefix>_text_document",
            "--vocab-file", "gpt2-vocab.json", "--merge-file", "gpt2-merges.txt", "--data-impl", "mmap",
            "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "0.00015", "--lr-decay-style", "cosine",
            "--min-lr", "1.0e-5", "--weight-decay", "1e-2", "--clip-grad", "1.0", "--lr-warmup-fraction", ".01",
            "--activations-checkpoint-method", "uniform", "--log-interval", "100", "--save-interval", "10000",
            "--eval-interval", "1000", "--eval-iters", "10", "--fp16",
        ),
        outcome="trains",
    ),

    Launch(
        name="megatron-lm-2024-pretrain-gpt",
        script=Source("NVIDIA/Megatron-LM", "examples/pretrain_gpt.sh",
                      "227bfb1a4c0c3a52231490cac972952a3cd65ec3"),
        program="pretrain_gpt.py", world_size=1,
        expanded=("`torchrun pretrain_gpt.py` (one process); $CHECKPOINT_PATH, $VOCAB_FILE, $MERGE_FILE, "
                  "$DATA_PATH: the script's <placeholders>; GPT_ARGS, DATA_ARGS, OUTPUT_ARGS in that order"),
        argv=(
            "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
            "--max-position-embeddings", "1024", "--micro-batch-size", "4", "--global-batch-size", "8",
            "--lr", "0.00015", "--train-iters", "500000", "--lr-decay-iters", "320000", "--lr-decay-style", "cosine",
            "--min-lr", "1.0e-5", "--weight-decay", "1e-2", "--lr-warmup-fraction", ".01", "--clip-grad", "1.0",
            "--fp16", "--data-path", "<Specify path and file prefix>_text_document",
            "--vocab-file", "<Specify path to file>/gpt2-vocab.json",
            "--merge-file", "<Specify path to file>/gpt2-merges.txt", "--split", "949,50,1", "--log-interval", "100",
            "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "10", "--save", "<Specify path>",
            "--load", "<Specify path>",
        ),
        outcome="trains",
    ),

    Launch(
        name="megatron-lm-2024-pretrain-gpt-distributed-with-mp",
        script=Source("NVIDIA/Megatron-LM", "examples/pretrain_gpt_distributed_with_mp.sh",
                      "227bfb1a4c0c3a52231490cac972952a3cd65ec3"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("GPUS_PER_NODE=8 x NNODES=1; GPT_ARGS, DATA_ARGS, OUTPUT_ARGS, then the script's own "
                  "flags"),
        argv=(
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel",
            "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
            "--max-position-embeddings", "1024", "--micro-batch-size", "4", "--global-batch-size", "16",
            "--lr", "0.00015", "--train-iters", "500000", "--lr-decay-iters", "320000", "--lr-decay-style", "cosine",
            "--min-lr", "1.0e-5", "--weight-decay", "1e-2", "--lr-warmup-fraction", ".01", "--clip-grad", "1.0",
            "--fp16", "--data-path", "<Specify path and file prefix>_text_document",
            "--vocab-file", "<Specify path to file>/gpt2-vocab.json",
            "--merge-file", "<Specify path to file>/gpt2-merges.txt", "--split", "949,50,1", "--log-interval", "100",
            "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "10",
            "--distributed-backend", "nccl", "--save", "<Specify path>", "--load", "<Specify path>",
        ),
        outcome="trains",
    ),

    Launch(
        name="megatron-lm-2024-pretrain-gpt3-175b",
        script=Source("NVIDIA/Megatron-LM", "examples/pretrain_gpt3_175B.sh",
                      "227bfb1a4c0c3a52231490cac972952a3cd65ec3"),
        program="pretrain_gpt.py", world_size=1024,
        expanded=("#SBATCH --nodes=128 x 8 tasks; DATASET='0.2 ${DATASET_1} 0.3 ${DATASET_2} 0.5 "
                  "${DATASET_3}'; `$@` empty"),
        argv=(
            "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16", "--num-layers", "96",
            "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "1536",
            "--rampup-batch-size", "16", "16", "5859375", "--train-samples", "146484375",
            "--lr-decay-samples", "126953125", "--lr-warmup-samples", "183105", "--lr", "6.0e-5",
            "--min-lr", "6.0e-6", "--lr-decay-style", "cosine", "--log-interval", "10", "--eval-iters", "40",
            "--eval-interval", "1000",
            "--data-path", "0.2", "<PATH TO THE FIRST DATASET>", "0.3", "<PATH TO THE SECOND DATASET>", "0.5", "<PATH TO THE THIRD DATASET>",
            "--vocab-file", "<PATH TO gpt-vocab.json>", "--merge-file", "<PATH TO gpt-merges.txt>",
            "--save-interval", "1000", "--save", "<PATH TO CHECKPOINTS DIRECTORY>",
            "--load", "<PATH TO CHECKPOINTS DIRECTORY>", "--split", "98,2,0", "--clip-grad", "1.0",
            "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--init-method-std", "0.006",
            "--tensorboard-dir", "<TENSORBOARD DIRECTORY>", "--fp16",
        ),
        outcome="trains",
    ),

    Launch(
        name="megatron-lm-gpt3-train-gpt3-175b-distributed",
        script=Source("NVIDIA/Megatron-LM", "examples/gpt3/train_gpt3_175b_distributed.sh",
                      "fa0dcc48720ed9f440f36c7973fe5e7a54c7d208"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("GPUS_PER_NODE=8 x NUM_NODES=1; the five positional arguments $1..$5 (checkpoint, "
                  "tensorboard, vocab, merges, data) as <CHECKPOINT_PATH> ... <DATA_PATH>"),
        argv=(
            "--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--attention-backend", "auto", "--micro-batch-size", "1",
            "--global-batch-size", "1536", "--rampup-batch-size", "16", "16", "5859375", "--train-iters", "500000",
            "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--init-method-std", "0.006",
            "--clip-grad", "1.0", "--fp16", "--lr", "6.0e-5", "--lr-decay-style", "cosine", "--min-lr", "6.0e-6",
            "--lr-warmup-fraction", ".001", "--lr-decay-iters", "430000", "--tensor-model-parallel-size", "8",
            "--pipeline-model-parallel-size", "16", "--data-path", "<DATA_PATH>", "--vocab-file", "<VOCAB_FILE>",
            "--merge-file", "<MERGE_FILE>", "--split", "949,50,1", "--log-interval", "100",
            "--save-interval", "10000", "--eval-interval", "1000", "--save", "<CHECKPOINT_PATH>",
            "--load", "<CHECKPOINT_PATH>", "--eval-iters", "10", "--tensorboard-dir", "<TENSORBOARD_LOGS_PATH>",
        ),
        outcome="trains",
    ),

    Launch(
        name="megatron-lm-llama-train-llama3-8b-h100-fp8",
        script=Source("NVIDIA/Megatron-LM", "examples/llama/train_llama3_8b_h100_fp8.sh",
                      "779c5b748dbcf00ad9e36d539c576b404ab4abe9"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("GPUS_PER_NODE=8 x NUM_NODES=1 under torchrun; the four positional arguments $1..$4 given "
                  "(checkpoint, tensorboard, tokenizer, data) as <CHECKPOINT_PATH> ... <DATA_ARG>, so the real-data "
                  "branch of DATA_ARGS_LIST; DTYPE=fp8; ${PWD}: the script's folder. The arrays expand unquoted, "
                  "so \"--split '99,1,0'\" becomes --split and '99,1,0' with its quotes"),
        argv=(
            "--use-mcore-models", "--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336",
            "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8", "--kv-channels",
            "128", "--seq-length", "8192", "--max-position-embeddings", "8192", "--position-embedding-type", "rope",
            "--rotary-base", "1000000", "--rotary-percent", "1.0", "--attention-dropout", "0.0", "--hidden-dropout",
            "0.0", "--swiglu", "--normalization", "RMSNorm", "--init-method-std", "0.0134", "--attention-backend",
            "fused", "--apply-layernorm-1p", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
            "--micro-batch-size", "1", "--global-batch-size", "128", "--train-samples", "1953125000",
            "--lr-decay-samples", "1949218748", "--lr-warmup-samples", "3906252", "--lr", "0.00015", "--min-lr",
            "0.00001", "--decoupled-lr", "5.0e-4", "--decoupled-min-lr", "4.5e-5", "--lr-decay-style", "cosine",
            "--clip-grad", "1.0", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16",
            "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion", "--calculate-per-token-loss", "--manual-gc",
            "--empty-unused-memory-level", "1", "--exit-duration-in-mins", "235", "--use-distributed-optimizer",
            "--overlap-grad-reduce", "--overlap-param-gather", "--fp8-format", "hybrid", "--fp8-amax-history-len",
            "1024", "--fp8-amax-compute-algo", "max", "--fp8-param-gather", "--tensor-model-parallel-size", "1",
            "--context-parallel-size", "1", "--sequence-parallel", "--data-path", "<DATA_ARG>", "--tokenizer-type",
            "HuggingFaceTokenizer", "--tokenizer-model", "<TOKENIZER_ARG>", "--data-cache-path",
            "examples/llama/benchmark_cache_llama3_8b_fp8", "--split", "'99,1,0'",
            "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "1", "--vocab-size",
            "128256", "--log-interval", "1", "--eval-iters", "32", "--eval-interval", "100", "--save-interval", "1000",
            "--log-throughput", "--profile", "--profile-step-start", "4", "--profile-step-end", "6", "--ckpt-format",
            "torch_dist", "--distributed-timeout-minutes", "60", "--save", "<CHECKPOINT_PATH>", "--load",
            "<CHECKPOINT_PATH>", "--tensorboard-dir", "<TENSORBOARD_LOGS_PATH>",
        ),
        # Its Llama 3 blocks (RMSNorm, SwiGLU, rope, GQA, untied, no biases) are accepted, and its FP8 (delayed,
        # hybrid) with --fp8-param-gather under the distributed optimizer: the FP8 weights gathered as e4m3 bytes
        # (docs/fp8.md).
        outcome="trains",
    ),

    Launch(
        name="megatron-lm-gptoss-train",
        script=Source("NVIDIA/Megatron-LM", "examples/gptoss/02_train.sh",
                      "d98e8a64ddf34856e74b24714e3bedb2f5a39553"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("GPUS_PER_NODE=8 x NUM_NODES=1 under torch.distributed.run; --checkpoint-path <CHECKPOINT_PATH> and "
                  "the defaults TOKENIZER_ARG=MOCK, DATA_ARG=MOCK, so the mock-data branch of DATA_ARGS_LIST; "
                  "PP_SIZE=WORLD_SIZE=8; ${PWD}: the script's folder. The arrays expand unquoted, so "
                  "\"--split '99,1,0'\" becomes --split and '99,1,0' with its quotes"),
        argv=(
            "--no-masked-softmax-fusion", "--transformer-impl", "transformer_engine", "--disable-bias-linear",
            "--untie-embeddings-and-output-weights", "--no-rope-fusion", "--normalization", "RMSNorm",
            "--num-layers", "12", "--hidden-size", "512", "--ffn-hidden-size", "2048", "--num-attention-heads", "64",
            "--group-query-attention", "--num-query-groups", "8", "--seq-length", "8192",
            "--max-position-embeddings", "8192", "--use-mcore-models", "--rotary-percent", "1.0", "--rope-type",
            "rope", "--position-embedding-type", "rope", "--rotary-base", "10000", "--no-bias-gelu-fusion",
            "--export-force-local-attention", "--no-bias-dropout-fusion", "--quick-geglu", "--glu-linear-offset",
            "1.0", "--softmax-type", "learnable", "--window-attn-skip-freq", "2", "--activation-func-clamp-value",
            "7.0", "--window-size", "127,0", "--enable-gpt-oss", "--num-experts", "4", "--moe-router-topk", "2",
            "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-3", "--moe-grouped-gemm",
            "--moe-token-dispatcher-type", "alltoall", "--overlap-param-gather", "--overlap-grad-reduce",
            "--moe-ffn-hidden-size", "2048", "--moe-router-dtype", "fp32", "--moe-z-loss-coeff", "1e-3",
            "--moe-permute-fusion", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128256",
            "--data-cache-path", "benchmark_cache_gpt_oss_20b", "--tiktoken-pattern", "v2", "--split", "'99,1,0'",
            "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "1",
            "--micro-batch-size", "1", "--global-batch-size", "128", "--lr", "1.0e-5", "--train-samples",
            "1953125000", "--lr-decay-samples", "1949218748", "--lr-decay-style", "cosine", "--min-lr", "1.0e-6",
            "--weight-decay", "0.1", "--lr-warmup-fraction", "0.05", "--clip-grad", "1.0", "--bf16",
            "--use-flash-attn", "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32",
            "--disable-bf16-reduced-precision-matmul", "--recompute-activations", "--tensor-model-parallel-size",
            "1", "--pipeline-model-parallel-size", "8", "--expert-model-parallel-size", "1", "--sequence-parallel",
            "--context-parallel-size", "1", "--use-distributed-optimizer", "--fp8-format", "hybrid",
            "--fp8-param-gather", "--fp8-amax-compute-algo", "max", "--fp8-amax-history-len", "1024",
            "--log-interval", "1", "--save-interval", "10000", "--eval-interval", "50000000", "--eval-iters", "0",
            "--save", "<CHECKPOINT_PATH>", "--tensorboard-dir", "<CHECKPOINT_PATH>/tensorboard",
            "--moe-per-layer-logging", "--no-load-optim", "--no-load-rng", "--log-throughput",
        ),
        # GPT-OSS's blocks (attention sinks --softmax-type learnable, --quick-geglu with --glu-linear-offset and
        # --activation-func-clamp-value, the sliding window on every other layer, experts with biases) are accepted,
        # and ModelOpt's --enable-gpt-oss has no effect in pretraining; its FP8 (delayed, hybrid) at PP 8 with
        # --fp8-param-gather under the distributed optimizer trains (docs/fp8.md).
        outcome="trains",
    ),
)
