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
)
