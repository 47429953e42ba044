"""The replay corpus, round 6 (issue 81): Zyphra's MoE pretraining run on its Megatron-LM fork (Zyphra/Megatron-LM,
main's last commit, 2023-12-06; the script last changed 2023-11-26), the 1.3B model with 8 experts of their
BlackMamba-era MoE study. See launch.py for what an entry holds and how the lists were taken.

The fork adds `--tokenizer-type HFAutoTokenizer` with `--hf_autotokenizer_model` (megatron/tokenizer/tokenizer.py
_HFAutoTokenizer: transformers' AutoTokenizer plus a `<|padding|>` pad token, its vocabulary size
`tokenizer.vocab_size`, the added tokens left out), which is not here: the launch is refused for it, as OpenGPT-X's
is for its fork's tokenizer.
"""

from __future__ import annotations

from tests.replay_corpus.launch import Launch, Source

MEGARUN = Launch(
    name='zyphra-moe-1.3b-8e-megarun',
    script=Source('Zyphra/Megatron-LM', 'examples/megarun_slurm/moe_1p3B_8E_bare.sh',
                  'fa8b646db406262c9faaaa3b096d173f8bbfffc1'),
    program='pretrain_gpt.py', world_size=64,
    expanded=("run with bash on its rank-0 node (hostname GPU627A, from the script's own table of 8 nodes), the "
              "torchrun stub recording what follows /opt/Megatron-LM/pretrain_gpt.py; the script's values (NNODES 8, "
              "GPUS_PER_NODE 8) and paths as written"),
    argv=(
        '--num-layers', '24', '--hidden-size', '2048', '--num-attention-heads', '16', '--seq-length', '2048',
        '--max-position-embeddings', '2048', '--micro-batch-size', '6', '--global-batch-size', '1152', '--lr',
        '0.00025', '--override-opt_param-scheduler', '--train-iters', '290000', '--lr-decay-iters', '290000',
        '--lr-decay-style', 'cosine', '--min-lr', '1.0e-6', '--weight-decay', '0.0', '--lr-warmup-fraction', '.01',
        '--clip-grad', '1.0', '--bf16', '--num-experts', '8', '--expert-model-parallel-size', '8',
        '--recompute-granularity', 'selective', '--use-flash-attn', '--accumulate-allreduce-grads-in-fp32',
        '--attention-dropout', '0.0', '--hidden-dropout', '0.0', '--swiglu', '--position-embedding-type', 'rope',
        '--use-rotary-position-embeddings', '--adam-beta2', '0.95', '--data-path',
        '/datasets/SlimPajama-627B_megatron/gpt-neox-20b-tokenizer/train_text_document', '--vocab-file',
        '/datasets/SlimPajama-627B_megatron/gpt-neox-20b-tokenizer/vocab.json', '--merge-file',
        '/datasets/SlimPajama-627B_megatron/gpt-neox-20b-tokenizer/merges.txt', '--split', '949,50,1',
        '--num-workers', '0', '--distributed-timeout-minutes', '120', '--tokenizer-type', 'HFAutoTokenizer',
        '--hf_autotokenizer_model', 'EleutherAI/gpt-neox-20b', '--log-interval', '1', '--save-interval', '5000',
        '--eval-interval', '500', '--eval-iters', '50', '--wandb-project', 'moe', '--wandb-exp-name',
        'final_moe_1p3b_8e_600B_slimpj_bf16', '--wandb-save-dir', '/checkpoints/megarun/wandb_bf16',
        '--distributed-backend', 'nccl', '--save', '/checkpoints/megarun/ckpts_1p3b_bf16', '--load',
        '/checkpoints/megarun/ckpts_1p3b_bf16',
    ),
    outcome="refused: invalid choice: 'HFAutoTokenizer'",
)

LAUNCHES = (MEGARUN,)
