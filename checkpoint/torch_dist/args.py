"""The args a `--ckpt-format torch_dist` save writes into common.pt: what Megatron-LM's parse_args gives the same
command line, for every field its load reads, so Megatron-LM continues with `--load` alone. no_save_rng is True (our
streams are not Megatron-Core's) and iteration is the saved one.
"""

from __future__ import annotations

import argparse
from typing import Optional

import torch

from checkpoint.torch_dist.common import TORCH_DIST_BACKEND
from checkpoint.torch_dist.names import hybrid_layer_symbols
from gpt.moe.settings import moe_layer_pattern
from parallel.state import ParallelState

# What Megatron-LM's load reads of the args (check_checkpoint_args, load_checkpoint, _load_args_from_checkpoint).
READ_AT_LOAD = (
    "num_layers", "hidden_size", "num_attention_heads", "add_position_embedding", "max_position_embeddings",
    "make_vocab_size_divisible_by", "padded_vocab_size", "tokenizer_type", "data_parallel_random_init",
    "global_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "world_size",
    "data_parallel_size", "no_save_rng", "no_save_optim", "ckpt_fully_parallel_save", "consumed_train_samples",
    "skipped_train_samples", "consumed_valid_samples", "add_bias_linear", "add_qkv_bias",
    "apply_query_key_layer_scaling", "attention_dropout", "ckpt_format", "expert_model_parallel_size",
    "ffn_hidden_size", "group_query_attention", "heterogeneous_layers_config_encoded_json",
    "heterogeneous_layers_config_path", "hidden_dropout", "hybrid_attention_ratio", "hybrid_mlp_ratio",
    "hybrid_override_pattern", "is_hybrid_model", "kv_channels", "mamba_head_dim", "mamba_num_groups",
    "mamba_num_heads", "mamba_state_dim", "moe_ffn_hidden_size", "moe_grouped_gemm", "moe_latent_size",
    "moe_layer_freq", "moe_router_enable_expert_bias", "moe_router_pre_softmax", "moe_router_score_function",
    "moe_router_topk", "moe_router_topk_scaling_factor", "moe_shared_expert_intermediate_size",
    "moe_token_dispatcher_type", "normalization", "num_experts", "num_layers_per_virtual_pipeline_stage",
    "num_query_groups", "position_embedding_type", "rotary_base", "rotary_interleaved", "rotary_percent",
    "seq_length", "spec", "squared_relu", "swiglu", "tiktoken_pattern", "tokenizer_model",
    "untie_embeddings_and_output_weights", "use_rotary_position_embeddings", "virtual_pipeline_model_parallel_size")
# Megatron-LM's defaults of fields its load reads that this save has nothing for.
NOT_OURS = dict(
    apply_query_key_layer_scaling=False, heterogeneous_layers_config_encoded_json=None,
    heterogeneous_layers_config_path=None, hybrid_attention_ratio=0.0, hybrid_mlp_ratio=0.0,
    hybrid_override_pattern=None, is_hybrid_model=False, spec=None, tiktoken_pattern=None, tokenizer_model=None,
    expert_model_parallel_size=1, num_experts=None, moe_ffn_hidden_size=None, moe_grouped_gemm=False, moe_latent_size=None, moe_layer_freq=1,
    moe_router_enable_expert_bias=False, moe_router_pre_softmax=False, moe_router_score_function="softmax",
    moe_router_topk=2, moe_router_topk_scaling_factor=None, moe_shared_expert_intermediate_size=None,
    moe_token_dispatcher_type="allgather")
NULL_TOKENIZER = "NullTokenizer"


def _typed_vocab_size(config) -> Optional[int]:
    """args.vocab_size: the --vocab-size typed (NullTokenizer adds its end-of-document id); None where none was typed.
    """
    if config.data.tokenizer_type == NULL_TOKENIZER:
        return config.model.vocab_size - 1
    return config.model.vocab_size if config.sources.get("vocab_size") is not None else None


def _integral(value):
    """Megatron-LM parses --rotary-base as an int."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def megatron_args(config, state: ParallelState, iteration: int, consumed_samples: int) -> argparse.Namespace:
    """common.pt's args (module docstring), under Megatron-LM's names, from the resolved config."""
    model, adam, training, parallel, data = (config.model, config.optimizer, config.training, config.parallel,
                                             config.data)
    precision = training.mixed_precision
    tp, pp = parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size
    gated_gelu = model.mlp.activation == "gelu_tanh" and model.add_bias_linear and not model.mlp.swiglu
    # training.py get_optimizer_param_scheduler sets lr_decay_iters to --train-iters where it is not given
    decay_iters = adam.lr_decay_iters or (training.train_iters if training.train_samples is None else None)
    values = dict(
        NOT_OURS,
        num_layers=model.num_layers, hidden_size=model.hidden_size, ffn_hidden_size=model.ffn_size,
        num_attention_heads=model.num_attention_heads, kv_channels=model.head_dim,
        group_query_attention=model.attention.num_query_groups is not None,
        num_query_groups=model.attention.num_query_groups or model.num_attention_heads, seq_length=model.seq_length,
        max_position_embeddings=model.max_position_embeddings, position_embedding_type=model.positions.position_embedding_type,
        # Deprecated for --position-embedding-type, which alone decides.
        add_position_embedding=True,
        use_rotary_position_embeddings=False, rotary_base=_integral(model.positions.rotary_base),
        rotary_percent=model.positions.rotary_percent, rotary_interleaved=model.positions.rotary_interleaved,
        normalization=model.norms.normalization, layernorm_epsilon=model.norms.layernorm_epsilon, swiglu=model.mlp.swiglu,
        quick_geglu=model.mlp.quick_geglu,  # --quick-geglu: gated too, its fc1 [gate; up] (source.py gated_mlp)
        layernorm_zero_centered_gamma=model.norms.apply_layernorm_1p,
        squared_relu=model.mlp.activation == "squared_relu", openai_gelu=False, bias_gelu_fusion=gated_gelu,
        add_bias_linear=model.add_bias_linear, add_qkv_bias=model.add_bias_linear or model.attention.add_qkv_bias,
        qk_layernorm=model.attention.qk_layernorm, qk_l2_norm=model.attention.qk_l2_norm, untie_embeddings_and_output_weights=model.output.untie_embeddings_and_output_weights,
        vocab_size=_typed_vocab_size(config), make_vocab_size_divisible_by=model.make_vocab_size_divisible_by,
        padded_vocab_size=model.padded_vocab_size(tp), init_method_std=model.init_method_std,
        hidden_dropout=model.hidden_dropout, attention_dropout=model.attention.attention_dropout,
        tokenizer_type=data.tokenizer_type, data_path=list(data.data_path or []) or None, split=data.split,
        mock_data=data.mock_data, seed=training.seed, micro_batch_size=training.micro_batch_size,
        global_batch_size=training.global_batch_size, train_iters=training.train_iters,
        train_samples=training.train_samples, lr=adam.lr, min_lr=adam.min_lr,
        lr_decay_style=adam.lr_decay_style, lr_decay_iters=decay_iters,
        lr_warmup_iters=adam.lr_warmup_iters, lr_warmup_fraction=adam.lr_warmup_fraction,
        weight_decay=adam.weight_decay, clip_grad=adam.clip_grad, adam_beta1=adam.adam_beta1,
        adam_beta2=adam.adam_beta2, adam_eps=adam.adam_eps, optimizer=adam.optimizer,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=_virtual_stages(parallel, model.num_layers),
        num_layers_per_virtual_pipeline_stage=parallel.num_layers_per_virtual_pipeline_stage,
        context_parallel_size=parallel.context_parallel_size, sequence_parallel=parallel.sequence_parallel,
        world_size=state.world_size, data_parallel_size=state.data_parallel_size,
        use_distributed_optimizer=config.zero.stage >= 1, fp16=precision.fp16, bf16=precision.bf16,
        params_dtype=torch.bfloat16 if precision.bf16 else torch.float16 if precision.fp16 else torch.float32,
        ckpt_format=TORCH_DIST_BACKEND, use_dist_ckpt=True, ckpt_fully_parallel_save=True,
        dist_ckpt_optim_fully_reshardable=config.zero.stage >= 1,
        iteration=iteration, consumed_train_samples=consumed_samples, skipped_train_samples=0,
        consumed_valid_samples=0, no_save_optim=None, no_save_rng=True,
        data_parallel_random_init=training.data_parallel_random_init,
        transformer_impl="local")
    return argparse.Namespace(**{**values, **_moe_args(config), **_mla_args(model), **_mixer_args(model),
                                 **_hybrid_args(model)})


def _mixer_args(model) -> dict:
    """The Mamba and Gated DeltaNet sizes as Megatron-LM 0.19's args hold them, and --linear-attention-freq as its
    parser keeps it."""
    mamba, gdn = model.mamba, model.gdn
    variant = "gated_delta_net" if gdn.gated_delta_net and not model.hybrid_layer_pattern else None
    freq = gdn.linear_attention_freq if variant else None
    if isinstance(freq, str):
        freq = [int(layer) for layer in gdn.gdn_layers(model.num_layers)]
    return dict(mamba_state_dim=mamba.mamba_state_dim, mamba_head_dim=mamba.mamba_head_dim,
                mamba_num_groups=mamba.mamba_num_groups, mamba_num_heads=mamba.mamba_num_heads,
                experimental_attention_variant=variant, linear_attention_freq=freq,
                linear_conv_kernel_dim=gdn.linear_conv_kernel_dim, linear_key_head_dim=gdn.linear_key_head_dim,
                linear_value_head_dim=gdn.linear_value_head_dim, linear_num_key_heads=gdn.linear_num_key_heads,
                linear_num_value_heads=gdn.linear_num_value_heads)


def _hybrid_args(model) -> dict:
    """A --hybrid-layer-pattern run's fields as validate_args leaves them; the pattern makes Megatron-Core 0.19 load the
    save as HybridModel's layout."""
    text = getattr(model, "hybrid_layer_pattern", None)
    if not text:
        return {}
    values = dict(hybrid_layer_pattern=text, num_layers=len(hybrid_layer_symbols(text)))
    if model.moe is not None:
        values["moe_layer_freq"] = 1
    return values


def _mla_args(model) -> dict:
    """Multi-latent attention's and MTP's fields under Megatron-LM's dests, at the flags' defaults where off."""
    mla = model.mla
    return dict(multi_latent_attention=mla.multi_latent_attention, q_lora_rank=mla.q_lora_rank,
                kv_lora_rank=mla.kv_lora_rank, qk_head_dim=mla.qk_head_dim,
                qk_pos_emb_head_dim=mla.qk_pos_emb_head_dim, v_head_dim=mla.v_head_dim, rope_type=mla.rope_type,
                # multi-token prediction's: Megatron-LM's --mtp-num-layers is None where not given (ours 0)
                mtp_num_layers=model.mtp.num_layers or None, mtp_loss_scaling_factor=model.mtp.loss_scaling_factor)


def _moe_args(config) -> dict:
    """The MoE fields as validate_args leaves them, for a model whose every MoE layer holds the same experts."""
    moe = config.model.moe
    if moe is None:
        return {}
    return dict(num_experts=moe.num_experts, moe_ffn_hidden_size=moe.ffn_hidden_size,
                moe_layer_freq=_layer_freq(config), moe_router_topk=moe.router_topk,
                moe_router_score_function=moe.router_score_function, moe_router_pre_softmax=moe.router_pre_softmax,
                moe_router_enable_expert_bias=moe.router_enable_expert_bias,
                moe_router_topk_scaling_factor=moe.router_topk_scaling_factor,
                moe_shared_expert_intermediate_size=moe.shared_expert_intermediate_size,
                moe_token_dispatcher_type=config.parallel.moe_token_dispatcher_type,
                expert_model_parallel_size=config.parallel.expert_model_parallel_size)


def _virtual_stages(parallel, num_layers: int) -> Optional[int]:
    """Megatron-LM's args.virtual_pipeline_model_parallel_size (validate_args derives it from either flag)."""
    if parallel.num_virtual_stages_per_pipeline_rank:
        return parallel.num_virtual_stages_per_pipeline_rank
    if parallel.num_layers_per_virtual_pipeline_stage:
        return num_layers // parallel.pipeline_model_parallel_size // parallel.num_layers_per_virtual_pipeline_stage
    return None


def _layer_freq(config):
    """--moe-layer-freq as Megatron-LM's parser keeps it: an int, or the list of 0/1."""
    freq = config.model.experts.layer_freq
    return freq if isinstance(freq, int) else [int(moe) for moe in moe_layer_pattern(freq, config.model.num_layers)]
