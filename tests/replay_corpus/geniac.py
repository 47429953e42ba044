"""The replay corpus, round 6 (issue 81): Matsuo Lab's GENIAC launches, the Japanese teams' 2024 pretraining runs on
their Megatron-DeepSpeed (matsuolab/nedo_project_code, one branch per team). See launch.py for what an entry holds
and how the lists were taken; `yq` read each team's YAML as kislyuk's yq over jq 1.6 does (the last of two equal
keys wins, 3.0e-4 printed 0.0003).

Team Hatakeyama's Tanuki-8B script vendors its Megatron-DeepSpeed: its JSON is what the script's `sed` writes from
that copy's `examples_deepspeed/rebase/ds_config_gpt_TEMPLATE.json`. Its `--recompute-granularity 'selective'`
keeps the quotes (the flags are one unquoted string), which Megatron-DeepSpeed's argparse refuses as an invalid
choice, and so does this program. Team Kawagoshi's 12B script writes its JSON with a heredoc. Team Ozaki's 11B
script is the GENIAC template (ucllm_nedo_dev) its README runs on hotsuyuki/Megatron-DeepSpeed at tag
ucllm_nedo_dev_v20240411.1.0, whose template its `sed` fills, and it passes that fork's W&B flags, spelled with
underscores (`--use_wandb`, `--wandb_entity`, `--wandb_project`, `--wandb_group`: the fork's aliases of
`--use-wandb`, `--wandb-entity`, ...).
"""

from __future__ import annotations

from tests.replay_corpus.launch import Launch, Source

_TANUKI_JSON = """{
  "train_batch_size": 1536,
  "train_micro_batch_size_per_gpu": 3,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 1
  },
  "gradient_clipping": 1.0,
  "prescale_gradients": false,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },
  "wall_clock_breakdown": false,
  "wandb": {
    "enabled": true,
    "group":"test_group",
    "project": "pretrain"
  }
}"""
_KAWAGOSHI_JSON = """{
  "train_batch_size" : 1960,
  "train_micro_batch_size_per_gpu": 2,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 1
  },
  "bf16": {
    "enabled": true
  },
  "data_types": {
    "grad_accum_dtype": "fp32" 
  },  
  "wandb": {
    "enabled": true,    
    "project": "Llama3_3node",
    "group": "test"
  },
  "gradient_clipping": 1,
  "prescale_gradients": false,
  "wall_clock_breakdown": false
}
"""
_UCLLM_JSON = """{
  "train_batch_size": 1022,
  "train_micro_batch_size_per_gpu": 2,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 1
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": false,

  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "wall_clock_breakdown" : false
}
"""

_NEDO = 'matsuolab/nedo_project_code'
# hotsuyuki/Megatron-DeepSpeed at tag ucllm_nedo_dev_v20240411.1.0, the fork team Ozaki's README checks out.
_UCLLM_TEMPLATE = Source('hotsuyuki/Megatron-DeepSpeed', 'examples_deepspeed/rebase/ds_config_gpt_TEMPLATE.json',
                         '038fd866ef2d3383c8c99c2e29f71fe33934a6df')
_TANUKI_SCRIPT = Source(_NEDO, 'team_hatakeyama/2_Pretrain/codes/3_train_multi_node_llama.sh',
                        '93041c7ca52796313406f641ca118a4e0a7e9d61')
_KAWAGOSHI_SCRIPT = Source(_NEDO, 'team_kawagoshi/pipeline/step4_pretrain_model/pretrain_llama3_3node.sh',
                           '960dfe1f9b476f801db8b70e8a1dc97bca24e08e')
_OZAKI_SCRIPT = Source(_NEDO, 'team_ozaki_code/learning/train/scripts/step2_pretrain_model/gcp_node-2_gpu/'
                       'dataset-original_tokenizer-sentencepice_model-llama2/prod_llama2_sbatch.sh',
                       'acae552fb0d5aaf43abdf4c93e0b98d46fd860ec')

LAUNCHES = (
    Launch(
        name='geniac-hatakeyama-tanuki-8b',
        script=_TANUKI_SCRIPT,
        program='pretrain_gpt.py', world_size=24,
        expanded=("run with bash from its folder (team_hatakeyama/2_Pretrain/codes) at the branch's last commit: "
                  "multinode_config_llama.yaml's llama3 values (NHOSTS 3, pp_size 3, global_batch_size 1536, "
                  "micro_batch_size 3, zero_stage 1), nvidia-smi 8 GPUs a node; the site folder "
                  "/storage5/llm/codes/2_pretrain its hostfile goes to exists; no SLURM variables"),
        argv=(
            '--override-opt_param-scheduler', '--adam-beta1', '0.9', '--adam-beta2', '0.95', '--adam-eps', '1e-08',
            '--tensor-model-parallel-size', '1', '--init-method-std', '0.02', '--lr-decay-tokens', '193537374076',
            '--lr-warmup-tokens', '2000000000', '--micro-batch-size', '3', '--exit-duration-in-mins', '300000000000',
            '--global-batch-size', '1536', '--num-layers', '32', '--hidden-size', '4096', '--ffn-hidden-size', '14336',
            '--num-attention-heads', '32', '--seq-length', '2048', '--max-position-embeddings', '2048',
            '--distributed-backend', 'nccl', '--train-tokens', '195537374076', '--train-samples', '300000000', '--lr',
            '0.0003', '--min-lr', '3e-05', '--lr-decay-style', 'cosine', '--split', '949,50,1', '--log-interval', '1',
            '--eval-interval', '46875000', '--eval-iters', '10', '--save-interval', '700', '--weight-decay', '0.1',
            '--clip-grad', '1.0', '--num-workers', '128', '--bf16', '--seed', '1234', '--load',
            '/storage5/checkpoints/0501llama//checkpoint/gpt_8B_tok300B_lr0.0003_min3e-05_w2000M_d193B_cosine_gbs1536_mbs3_g24_z1_pp3_seed1234_rebase',
            '--save',
            '/storage5/checkpoints/0501llama//checkpoint/gpt_8B_tok300B_lr0.0003_min3e-05_w2000M_d193B_cosine_gbs1536_mbs3_g24_z1_pp3_seed1234_rebase',
            '--no-async-tensor-model-parallel-allreduce', '--use-flash-attn-v2', '--tensorboard-queue-size', '1',
            '--log-timers-to-tensorboard', '--log-batch-size-to-tensorboard', '--log-validation-ppl-to-tensorboard',
            '--ds-sequence-parallel-size', '1', '--use-pin-memory', '--tensorboard-dir',
            '/storage5/checkpoints/0501llama//tensorboard/gpt_8B_tok300B_lr0.0003_min3e-05_w2000M_d193B_cosine_gbs1536_mbs3_g24_z1_pp3_seed1234_rebase_$HOSTNAME_$DATE',
            '--no-query-key-layer-scaling', '--layernorm-epsilon', '1e-5', '--attention-dropout', '0.0',
            '--hidden-dropout', '0.0', '--use-rotary-position-embeddings', '--untie-embeddings-and-output-weights',
            '--swiglu', '--normalization', 'rmsnorm', '--disable-bias-linear', '--no-bias-gelu-fusion',
            '--no-masked-softmax-fusion', '--no-position-embedding', '--num-key-value-heads', '8',
            '--recompute-activations', '--recompute-granularity', "'selective'", '--tokenizer-type',
            'SentencePieceTokenizer', '--tokenizer-model',
            '/storage5/split/split/split/tokernizer/tokenizer_scale200.model', '--data-path',
            '/storage5/split/split/split/tokenized_text_document', '--data-impl', 'mmap', '--deepspeed',
            '--deepspeed_config',
            '/storage5/checkpoints/0501llama//deepspeed_config/ds_config_gbs1536_mbs3_log1_zero1.json', '--zero-stage',
            '1', '--pipeline-model-parallel-size', '3',
        ),
        outcome='refused: invalid choice: "\'selective\'"',
        json=Source(_NEDO, 'team_hatakeyama/2_Pretrain/codes/Megatron-DeepSpeed/examples_deepspeed/rebase/'
                    'ds_config_gpt_TEMPLATE.json', '93041c7ca52796313406f641ca118a4e0a7e9d61'),
        json_generated=True,
        json_text=_TANUKI_JSON,
    ),
    Launch(
        name='geniac-kawagoshi-llama-12b',
        script=_KAWAGOSHI_SCRIPT,
        program='pretrain_gpt.py', world_size=24,
        expanded=("run with bash from its folder at the branch's last commit: NHOSTS 3, SLURM_JOB_ID 1 (its master "
                  "port), nvidia-smi 8 GPUs a node; the script's own values (GLOBAL_BATCH_SIZE 1960, pp_size 6, "
                  "zero_stage 1); its sed over a template under /storage2 reads nothing and the heredoc after it "
                  "writes the JSON"),
        argv=(
            '--num-workers', '0', '--override-opt_param-scheduler', '--tensor-model-parallel-size', '1',
            '--pipeline-model-parallel-size', '6', '--num-layers', '40', '--hidden-size', '5120', '--ffn-hidden-size',
            '13824', '--num-attention-heads', '40', '--micro-batch-size', '2', '--global-batch-size', '1960',
            '--seq-length', '2048', '--max-position-embeddings', '2048', '--train-iters', '250000', '--save',
            '/storage2/output/3node/checkpoint/Llama2_12B_tokB_lr_min3e-5_wM_dB__gbs1960_mbs2_g24_z1_pp6_seed1234_rebase',
            '--load',
            '/storage2/output/3node/checkpoint/Llama2_12B_tokB_lr_min3e-5_wM_dB__gbs1960_mbs2_g24_z1_pp6_seed1234_rebase',
            '--init-method-std', '0.008', '--tokenizer-type', 'SentencePieceTokenizer', '--tokenizer-model',
            '/storage2/tokenizer/en_ja_code_tokenizer/ja60K_en40K_code20K.model', '--split', '998,1,1',
            '--distributed-backend', 'nccl', '--lr', '3e-4', '--lr-decay-style', 'cosine', '--min-lr', '3e-5',
            '--weight-decay', '0.1', '--clip-grad', '1', '--lr-warmup-iters', '1000', '--optimizer', 'adam',
            '--adam-beta1', '0.9', '--adam-beta2', '0.95', '--log-interval', '1', '--save-interval', '200',
            '--eval-interval', '200000', '--eval-iters', '1000', '--bf16', '--no-query-key-layer-scaling',
            '--attention-dropout', '0', '--hidden-dropout', '0', '--use-rotary-position-embeddings',
            '--untie-embeddings-and-output-weights', '--swiglu', '--normalization', 'rmsnorm', '--disable-bias-linear',
            '--num-key-value-heads', '8', '--use-flash-attn-v2', '--seed', '1234', '--exit-duration-in-mins',
            '300000000000', '--tokenizer-type', 'SentencePieceTokenizer', '--tokenizer-model',
            '/storage2/tokenizer/en_ja_code_tokenizer/ja60K_en40K_code20K.model', '--data-path', '1',
            '/storage2/datasets/en_input/slimpajama_github_final_text_document', '--data-impl', 'mmap', '--deepspeed',
            '--deepspeed_config', '/storage2/output/3node/deepspeed_config/ds_config_gbs1960_mbs2_log_zero1.json',
            '--zero-stage', '1', '--pipeline-model-parallel-size', '6',
        ),
        outcome='trains',
        json=_KAWAGOSHI_SCRIPT,
        json_generated=True,
        json_text=_KAWAGOSHI_JSON,
    ),
    Launch(
        name='geniac-ozaki-llama2-11b',
        script=_OZAKI_SCRIPT,
        program='pretrain_gpt.py', world_size=24,
        expanded=("run with bash, HOME holding the README's ucllm_nedo_dev checkout (Megatron-DeepSpeed at tag "
                  "ucllm_nedo_dev_v20240411.1.0), with the arguments its usage line asks for: --input_tokenizer_file "
                  "<input_tokenizer_file> --input_data_path <input_data_path> --output_model_dir <output_model_dir> "
                  "--save_interval 1000 --wandb_entity <wandb_entity> --wandb_project <wandb_project>; SLURM_JOB_ID "
                  "1, nvidia-smi 8 GPUs a node (num_node 3 in the script)"),
        argv=(
            '--override-opt_param-scheduler', '--adam-beta1', '0.9', '--adam-beta2', '0.95',
            '--tensor-model-parallel-size', '1', '--init-method-std', '0.008', '--lr-decay-tokens', '200000000000',
            '--lr-warmup-tokens', '3000000000', '--micro-batch-size', '2', '--exit-duration-in-mins', '30000000',
            '--global-batch-size', '1022', '--num-layers', '40', '--hidden-size', '5120', '--ffn-hidden-size', '13824',
            '--num-attention-heads', '40', '--seq-length', '2048', '--max-position-embeddings', '2048',
            '--train-tokens', '200000000000', '--train-samples', '37400000', '--lr', '1e-4', '--min-lr', '1e-5',
            '--lr-decay-style', 'cosine', '--split', '949,50,1', '--log-interval', '10', '--eval-interval', '100',
            '--eval-iters', '10', '--save-interval', '1000', '--weight-decay', '0.1', '--clip-grad', '1.0',
            '--hysteresis', '2', '--num-workers', '0', '--no-query-key-layer-scaling', '--attention-dropout', '0',
            '--hidden-dropout', '0', '--use-rotary-position-embeddings', '--untie-embeddings-and-output-weights',
            '--swiglu', '--normalization', 'rmsnorm', '--disable-bias-linear', '--num-key-value-heads', '8', '--seed',
            '1234', '--load',
            '<output_model_dir>/checkpoint/llama2_11B_tok200B_<input_data_path>_lr1e-4_min1e-5_w3000M_d200B_cosine_gbs1022_mbs2_g24_z1_pp3_seed1234_rebase',
            '--save',
            '<output_model_dir>/checkpoint/llama2_11B_tok200B_<input_data_path>_lr1e-4_min1e-5_w3000M_d200B_cosine_gbs1022_mbs2_g24_z1_pp3_seed1234_rebase',
            '--no-async-tensor-model-parallel-allreduce', '--use-flash-attn-v2', '--tensorboard-queue-size', '1',
            '--log-timers-to-tensorboard', '--log-batch-size-to-tensorboard', '--log-validation-ppl-to-tensorboard',
            '--tensorboard-dir',
            '<output_model_dir>/tensorboard/llama2_11B_tok200B_<input_data_path>_lr1e-4_min1e-5_w3000M_d200B_cosine_gbs1022_mbs2_g24_z1_pp3_seed1234_rebase_$HOSTNAME_$DATE',
            '--log-optimizer-states-to-tensorboard', '--tokenizer-type', 'SentencePieceTokenizer', '--tokenizer-model',
            '<input_tokenizer_file>', '--data-path', '<input_data_path>_text_document', '--data-impl', 'mmap',
            '--deepspeed', '--deepspeed_config',
            '<output_model_dir>/deepspeed_config/ds_config_gbs1022_mbs2_log10_zero1.json', '--zero-stage', '1',
            '--pipeline-model-parallel-size', '3', '--use_wandb', '--wandb_entity', '<wandb_entity>', '--wandb_project',
            '<wandb_project>', '--wandb_group', 'pretrain_gpt_11B_$HOSTNAME_$DATE',
        ),
        outcome='trains',
        json=_UCLLM_TEMPLATE,
        json_generated=True,
        json_text=_UCLLM_JSON,
    ),
)
