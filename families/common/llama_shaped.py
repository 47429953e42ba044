"""Weights and config.json between a Llama-shaped `GPTModel` and transformers' LlamaForCausalLM (and Mixtral, Qwen2-MoE,
Apertus), with the conversions every Llama-layout family uses. Our fused QKV rows are [group][its query heads, k,
v][head_dim]; both sides rotate halves, so no rotary permutation is needed.
"""

from __future__ import annotations

from typing import Optional

import torch

from base.errors import ConfigError
from families.common.features import uncarried
from families.common.fields import LLAMA3_FIXED
from gpt.model_config import ModelConfig
from gpt.xielu import XIELU_BETA, XIELU_EPS

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"
# Mixtral: Llama's blocks with a mixture of experts.
MIXTRAL_TYPE = "mixtral"
QWEN2_MOE_TYPE = "qwen2_moe"  # Qwen2-MoE: a gated shared expert beside the routed ones, q/k/v biases
MOE_TYPES = (MIXTRAL_TYPE, QWEN2_MOE_TYPE)
APERTUS_TYPE, APERTUS_ARCHITECTURE = "apertus", "ApertusForCausalLM"  # --xielu (swiss-ai's Apertus)
# The block features the Llama-shaped classes hold: a q, k, v bias.
LLAMA_CARRIES = ("add_qkv_bias",)
APERTUS_CARRIES = ("add_qkv_bias", "qk_layernorm", "qk_layernorm_over_projection")
# Old transformers saved rotary inverse frequencies with the weights; they are not weights.
BUFFER_SUFFIXES = (".rotary_emb.inv_freq",)


def beyond_llama(config: ModelConfig, carries: tuple[str, ...] = ()) -> dict[str, bool]:
    """What no Llama-shaped class holds ({the flag it would need: whether the model has it}): every block feature but
    `carries`, sliding windows, local and interpolated rotary."""
    return {"no --window-size": config.has_windows(), **{need: True for need in uncarried(config, carries)},
            "no --local-rotary-base": config.positions.local_rotary_base is not None,
            "no --rotary-seq-len-interpolation-factor": config.positions.rotary_seq_len_interpolation_factor is not None}


def llama_misfits(config: ModelConfig) -> list[str]:
    """What keeps `config` from being a LlamaForCausalLM: the flag each needs, or the setting it lacks."""
    needs = {**beyond_llama(config, LLAMA_CARRIES), "--normalization RMSNorm": config.norms.normalization != "RMSNorm",
             "--swiglu": not config.mlp.swiglu,
             "--position-embedding-type rope": config.positions.position_embedding_type != "rope",
             "--rotary-percent 1.0": config.positions.rotary_percent != 1.0,
             # transformers' Llama rotates halves; interleaved rows would need a permutation not written here.
             "no --rotary-interleaved": config.positions.rotary_interleaved,
             "no --multi-latent-attention": config.mla.multi_latent_attention,
             "no --add-qkv-bias without the other biases (transformers' attention_bias covers o_proj too)":
                 config.attention.add_qkv_bias and not config.add_bias_linear and moe_family(config) != QWEN2_MOE_TYPE}
    if config.moe is not None:
        needs = {need: missing for need, missing in needs.items() if missing}
        needs.update({need: True for need in moe_misfits(config)})
    if is_apertus(config):
        needs = {**beyond_llama(config, APERTUS_CARRIES), **apertus_needs(config)}
    return [need for need, missing in needs.items() if missing]


def is_apertus(config: ModelConfig) -> bool:
    """--xielu: exported as ApertusForCausalLM (a Llama with an xIELU MLP and per-head q/k RMSNorms)."""
    return config.mlp.activation == "xielu"


def apertus_needs(config: ModelConfig) -> dict[str, bool]:
    """What keeps a --xielu model from being an ApertusForCausalLM (RMSNorms, rotary, per-head q/k norms, no MLP bias, a
    bias on all of q, k, v, o or none, head width hidden / heads)."""
    return {"--normalization RMSNorm": config.norms.normalization != "RMSNorm",
            "--position-embedding-type rope": config.positions.position_embedding_type != "rope",
            "--rotary-percent 1.0": config.positions.rotary_percent != 1.0,
            "no --rotary-interleaved": config.positions.rotary_interleaved,
            "no --attention-output-gate": config.attention.attention_output_gate,
            "no --multi-latent-attention": config.mla.multi_latent_attention,
            "--qk-layernorm (Apertus normalizes each query and key head)": not config.attention.qk_layernorm,
            "no --qk-layernorm-over-projection (Apertus's norms act over each head)":
                config.attention.qk_layernorm_over_projection,
            "--disable-bias-linear (Apertus's linears have no biases)": config.add_bias_linear,
            "no --add-qkv-bias": config.attention.add_qkv_bias,
            "no --num-experts (Apertus has no experts)": config.moe is not None,
            "no --kv-channels other than hidden / heads (ApertusConfig has no head_dim)":
                config.head_dim * config.num_attention_heads != config.hidden_size}


def moe_family(config: ModelConfig) -> Optional[str]:
    """The transformers class family an MoE model exports as: Qwen2-MoE with a gated shared expert, else Mixtral."""
    if config.moe is None:
        return None
    return QWEN2_MOE_TYPE if config.moe.shared_expert_intermediate_size is not None else MIXTRAL_TYPE


def moe_misfits(config: ModelConfig) -> list[str]:
    """What keeps an MoE model from being a Mixtral or Qwen2-MoE: both take a softmax top k over all experts, drop no
    token and add no expert bias."""
    moe, family = config.moe, moe_family(config)
    needs = {"--moe-gating megatron (DeepSpeed-MoE's capacity and sampling are not theirs)": moe.deepspeed.gating != "megatron",
             "one --num-experts for every MoE layer (their config has one count)": config.experts.per_layer,
             "--mlp-type standard (PR-MoE's residual MLP and coefficient have no place there)": moe.deepspeed.use_residual,
             "--moe-router-score-function softmax": moe.router_score_function != "softmax",
             "no --moe-router-topk-scaling-factor": bool(moe.router_topk_scaling_factor),
             "no group-limited routing": moe.router_group_topk is not None,
             "no --moe-router-enable-expert-bias": moe.router_enable_expert_bias,
             "no --moe-expert-capacity-factor (transformers drops no token)": moe.expert_capacity_factor is not None,
             "no --add-bias-linear (no bias in their experts)": config.add_bias_linear}
    if family == MIXTRAL_TYPE:
        needs.update({"no --moe-router-pre-softmax (Mixtral renormalizes the top k)": moe.router_pre_softmax,
                      "an MoE layer in every layer (Mixtral has no dense layers)": not all(config.moe_layers()),
                      "no --add-qkv-bias (Mixtral's attention has no bias)": config.attention.add_qkv_bias})
    else:
        needs["--moe-shared-expert-gate (Qwen2-MoE's shared expert is gated)"] = not moe.shared_expert_gate
    return [need for need, missing in needs.items() if missing]


def check_llama_shaped(config: ModelConfig, what: str, also: tuple[str, ...] = ()) -> None:
    """Refused in one line naming what a Llama-shaped class would need, and `also` (the caller's other needs)."""
    misfits = llama_misfits(config)
    if misfits:
        raise ConfigError(f"{what} converts GPT-2- or Llama-shaped models; as a {architecture_of(config)} this one "
                          f"would need {', '.join((*misfits, *also))}")


def architecture_of(config: ModelConfig) -> str:
    if is_apertus(config):
        return APERTUS_ARCHITECTURE
    return {MIXTRAL_TYPE: "MixtralForCausalLM", QWEN2_MOE_TYPE: "Qwen2MoeForCausalLM"}.get(moe_family(config),
                                                                                          ARCHITECTURE)


def rope_parameters(config: ModelConfig) -> dict:
    if not config.positions.use_rope_scaling:
        return {"rope_type": "default", "rope_theta": config.positions.rotary_base}
    return {"rope_type": "llama3", "rope_theta": config.positions.rotary_base, "factor": config.positions.rope_scaling_factor,
            **LLAMA3_FIXED}


def llama_hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    """A transformers LlamaConfig (MixtralConfig, Qwen2MoeConfig for MoE) describing the same network; BOS and EOS are
    our end-of-document id."""
    from transformers import LlamaConfig, MixtralConfig, Qwen2MoeConfig

    common = dict(bos_token_id=eod_token_id, eos_token_id=eod_token_id, pad_token_id=None,
                  vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
                  num_attention_heads=config.num_attention_heads,
                  num_key_value_heads=config.attention.query_groups(config.num_attention_heads), head_dim=config.head_dim,
                  max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.norms.layernorm_epsilon,
                  rope_parameters=rope_parameters(config), hidden_act="silu",
                  tie_word_embeddings=not config.output.untie_embeddings_and_output_weights,
                  attention_dropout=config.attention.attention_dropout, initializer_range=config.init_method_std)
    if is_apertus(config):
        from transformers import ApertusConfig

        return ApertusConfig(**{key: value for key, value in common.items() if key not in ("head_dim", "hidden_act")},
                             intermediate_size=config.ffn_size, hidden_act="xielu", attention_bias=False)
    moe = config.moe
    if moe_family(config) == MIXTRAL_TYPE:
        return MixtralConfig(**common, intermediate_size=moe.ffn_hidden_size, num_local_experts=moe.num_experts,
                             num_experts_per_tok=moe.router_topk, router_jitter_noise=0.0, sliding_window=None,
                             router_aux_loss_coef=moe.aux_loss_coeff)
    if moe_family(config) == QWEN2_MOE_TYPE:
        return Qwen2MoeConfig(**common, intermediate_size=config.ffn_size, moe_intermediate_size=moe.ffn_hidden_size,
                              shared_expert_intermediate_size=moe.shared_expert_intermediate_size,
                              num_experts=moe.num_experts, num_experts_per_tok=moe.router_topk,
                              norm_topk_prob=not moe.router_pre_softmax, qkv_bias=config.attention.qkv_bias(config.add_bias_linear),
                              decoder_sparse_step=1, use_sliding_window=False, router_aux_loss_coef=moe.aux_loss_coeff,
                              mlp_only_layers=[i for i, is_moe in enumerate(config.moe_layers()) if not is_moe])
    return LlamaConfig(
        bos_token_id=eod_token_id, eos_token_id=eod_token_id, pad_token_id=None,
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.ffn_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.attention.query_groups(config.num_attention_heads), head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.norms.layernorm_epsilon,
        rope_parameters=rope_parameters(config), hidden_act="silu",
        tie_word_embeddings=not config.output.untie_embeddings_and_output_weights,
        attention_bias=config.add_bias_linear, mlp_bias=config.add_bias_linear,
        attention_dropout=config.attention.attention_dropout, initializer_range=config.init_method_std)


def canonical_names(tensors: dict[str, torch.Tensor], family: str = MODEL_TYPE) -> dict[str, torch.Tensor]:
    """Names as LlamaForCausalLM has them (`model.` added where missing); saved rotary buffers dropped."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(BUFFER_SUFFIXES):
            continue
        if not name.startswith(("model.", "lm_head.")):
            name = "model." + name
        out.update(_per_expert(name, tensor, family) if family in MOE_TYPES else {name: tensor})
    return out


def _per_expert(name: str, tensor: torch.Tensor, family: str) -> dict[str, torch.Tensor]:
    """transformers 5's fused experts (gate_up_proj [E, 2 x ffn, h], gate rows first; down_proj [E, h, ffn]) under the
    per-expert names it saves (Mixtral's w1/w3/w2, Qwen2-MoE's gate/up/down_proj)."""
    layer, _, rest = name.partition(".mlp.")
    mixtral = family == MIXTRAL_TYPE
    experts = f"{layer}.block_sparse_moe.experts" if mixtral else f"{layer}.mlp.experts"
    gate_name, up_name, down_name = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    if mixtral and rest == "gate.weight":
        return {f"{layer}.block_sparse_moe.gate.weight": tensor}
    if rest == "experts.gate_up_proj":
        gate, up = tensor.chunk(2, dim=1)
        return {f"{experts}.{e}.{w}.weight": part[e]
                for e in range(tensor.shape[0]) for w, part in ((gate_name, gate), (up_name, up))}
    if rest == "experts.down_proj":
        return {f"{experts}.{e}.{down_name}.weight": tensor[e] for e in range(tensor.shape[0])}
    return {name: tensor}


_SAME = (("input_layernorm.weight", "input_layernorm.weight"),
         ("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
         ("attention.dense.weight", "self_attn.o_proj.weight"), ("attention.dense.bias", "self_attn.o_proj.bias"),
         ("mlp.dense_h_to_4h_gate.weight", "mlp.gate_proj.weight"), ("mlp.dense_h_to_4h_gate.bias", "mlp.gate_proj.bias"),
         ("mlp.dense_h_to_4h_up.weight", "mlp.up_proj.weight"), ("mlp.dense_h_to_4h_up.bias", "mlp.up_proj.bias"),
         ("mlp.dense_4h_to_h.weight", "mlp.down_proj.weight"), ("mlp.dense_4h_to_h.bias", "mlp.down_proj.bias"))


# An ApertusForCausalLM layer's names for ours (no biases).
_APERTUS_SAME = (("input_layernorm.weight", "attention_layernorm.weight"),
                 ("post_attention_layernorm.weight", "feedforward_layernorm.weight"),
                 ("attention.q_layernorm.weight", "self_attn.q_norm.weight"),
                 ("attention.k_layernorm.weight", "self_attn.k_norm.weight"),
                 ("attention.dense.weight", "self_attn.o_proj.weight"),
                 ("mlp.dense_h_to_4h.weight", "mlp.up_proj.weight"), ("mlp.dense_4h_to_h.weight", "mlp.down_proj.weight"),
                 ("mlp.activation_func.alpha_p", "mlp.act_fn.alpha_p"),
                 ("mlp.activation_func.alpha_n", "mlp.act_fn.alpha_n"))


def _kinds(config: ModelConfig) -> tuple[str, ...]:
    return ("weight", "bias") if config.add_bias_linear else ("weight",)


def ends_to_hf(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The tensors outside the layers under transformers' names: the embedding (padding rows cut), the final norm, an
    untied lm_head."""
    vocab = config.vocab_size
    out = {"model.embed_tokens.weight": state["word_embeddings.weight"][:vocab],
           "model.norm.weight": state["final_layernorm.weight"]}
    if config.output.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = state["output_layer.weight"][:vocab]
    return out


def ends_from_hf(hf_state: dict[str, torch.Tensor], config: ModelConfig, padded_vocab_size: int
                 ) -> dict[str, torch.Tensor]:
    """The inverse of `ends_to_hf`; padding rows are zeros."""
    out = {"word_embeddings.weight": padded_rows(hf_state["model.embed_tokens.weight"], padded_vocab_size),
           "final_layernorm.weight": hf_state["model.norm.weight"]}
    if config.output.untie_embeddings_and_output_weights:
        out["output_layer.weight"] = padded_rows(hf_state["lm_head.weight"], padded_vocab_size)
    return out


def to_llama_state_dict(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our whole (TP 1 layout) state dict under LlamaForCausalLM's names; a tied model has no lm_head."""
    check_llama_shaped(config, "the Hugging Face export")
    out = ends_to_hf(state_dict, config)
    for i in range(config.num_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        if is_apertus(config):
            out.update({theirs + their_name: state_dict[ours + our_name] for our_name, their_name in _APERTUS_SAME})
            # XIELUActivation's beta and eps buffers, in our values.
            out[theirs + "mlp.act_fn.beta"] = torch.tensor(XIELU_BETA)
            out[theirs + "mlp.act_fn.eps"] = torch.tensor(XIELU_EPS)
        for kind in _qkv_kinds(config):
            q, k, v = split_qkv(state_dict[ours + "attention.query_key_value." + kind], config)
            out.update({theirs + f"self_attn.{p}_proj." + kind: part for p, part in zip("qkv", (q, k, v))})
        for our_name, their_name in _SAME if not is_apertus(config) else ():
            if config.moe_layers()[i] and our_name.startswith("mlp."):
                continue
            if our_name.endswith("weight") or config.add_bias_linear:
                out[theirs + their_name] = state_dict[ours + our_name]
        if config.moe_layers()[i]:
            out.update({theirs + their_name: state_dict[ours + our_name]
                        for our_name, their_name in _moe_names(config, moe_family(config))})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def from_llama_state_dict(hf_state: dict[str, torch.Tensor], config: ModelConfig,
                          padded_vocab_size: int, family: str = MODEL_TYPE) -> dict[str, torch.Tensor]:
    """The inverse of `to_llama_state_dict`; padding rows are zeros."""
    out = ends_from_hf(hf_state, config, padded_vocab_size)
    for i in range(config.num_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        if is_apertus(config):
            _check_xielu_constants(hf_state, theirs)
            out.update({ours + our_name: hf_state[theirs + their_name] for our_name, their_name in _APERTUS_SAME})
        for kind in _qkv_kinds(config):
            out[ours + "attention.query_key_value." + kind] = fused_qkv(
                *(hf_state[theirs + f"self_attn.{p}_proj." + kind] for p in "qkv"), config)
        for our_name, their_name in _SAME if not is_apertus(config) else ():
            if config.moe_layers()[i] and our_name.startswith("mlp."):
                continue
            if our_name.endswith("weight") or config.add_bias_linear:
                out[ours + our_name] = hf_state[theirs + their_name]
        if config.moe_layers()[i]:
            out.update({ours + our_name: hf_state[theirs + their_name]
                        for our_name, their_name in _moe_names(config, family) if theirs + their_name in hf_state})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def padded_rows(tensor: torch.Tensor, padded_vocab_size: int) -> torch.Tensor:
    """A vocabulary's rows with zero rows up to our padded size."""
    return torch.cat([tensor, tensor.new_zeros(padded_vocab_size - tensor.shape[0], tensor.shape[1])])


def split_qkv(qkv: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our fused QKV weight (or bias) as q_proj, k_proj and v_proj."""
    heads, groups, d = config.num_attention_heads, config.attention.query_groups(config.num_attention_heads), \
        config.head_dim
    per_group, rest = heads // groups, qkv.shape[1:]
    qkv = qkv.reshape(groups, per_group + 2, d, *rest)
    return (qkv[:, :per_group].reshape(heads * d, *rest), qkv[:, per_group].reshape(groups * d, *rest),
            qkv[:, per_group + 1].reshape(groups * d, *rest))


def fused_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """The inverse of `split_qkv`."""
    heads, groups, d = config.num_attention_heads, config.attention.query_groups(config.num_attention_heads), \
        config.head_dim
    per_group, rest = heads // groups, q.shape[1:]
    fused = torch.cat([q.reshape(groups, per_group, d, *rest), k.reshape(groups, 1, d, *rest),
                       v.reshape(groups, 1, d, *rest)], dim=1)
    return fused.reshape(-1, *rest)


def _check_xielu_constants(hf_state: dict[str, torch.Tensor], layer: str) -> None:
    """XIELUActivation's beta and eps buffers must be ours (0.5 and the fork's bf16 -1e-6), else the folder is another
    function."""
    for name, ours in (("beta", XIELU_BETA), ("eps", XIELU_EPS)):
        tensor = hf_state.get(f"{layer}mlp.act_fn.{name}")
        if tensor is not None and abs(float(tensor) - ours) > abs(ours) * 2 ** -8:
            raise ConfigError(f"{layer}mlp.act_fn.{name} is {float(tensor)!r}: xIELU's {name} is {ours!r} here "
                              f"(swiss-ai's Megatron-LM fork fixes it)")


def _qkv_kinds(config: ModelConfig) -> tuple[str, ...]:
    """q, k and v have biases with --add-bias-linear, or alone with --add-qkv-bias (Qwen2)."""
    return ("weight", "bias") if config.attention.qkv_bias(config.add_bias_linear) else ("weight",)


def _moe_names(config: ModelConfig, family: str) -> list[tuple[str, str]]:
    if family == QWEN2_MOE_TYPE:
        return _qwen2_moe_names(config.moe.num_experts)
    return _mixtral_names(config.moe.num_experts)


def _qwen2_moe_names(num_experts: int) -> list[tuple[str, str]]:
    """(ours inside a block, a Qwen2-MoE layer's): router, experts, shared expert and its gate."""
    projections = (("dense_h_to_4h_gate", "gate_proj"), ("dense_h_to_4h_up", "up_proj"), ("dense_4h_to_h", "down_proj"))
    names = [("mlp.router.weight", "mlp.gate.weight"), ("mlp.shared_experts.gate_weight", "mlp.shared_expert_gate.weight")]
    names += [(f"mlp.shared_experts.{ours}.weight", f"mlp.shared_expert.{theirs}.weight") for ours, theirs in projections]
    for e in range(num_experts):
        names += [(f"mlp.experts.{e}.{ours}.weight", f"mlp.experts.{e}.{theirs}.weight") for ours, theirs in projections]
    return names


def _mixtral_names(num_experts: int) -> list[tuple[str, str]]:
    """(ours inside a block, a Mixtral layer's): router and experts."""
    names = [("mlp.router.weight", "block_sparse_moe.gate.weight")]
    for e in range(num_experts):
        names += [(f"mlp.experts.{e}.dense_h_to_4h_gate.weight", f"block_sparse_moe.experts.{e}.w1.weight"),
                  (f"mlp.experts.{e}.dense_h_to_4h_up.weight", f"block_sparse_moe.experts.{e}.w3.weight"),
                  (f"mlp.experts.{e}.dense_4h_to_h.weight", f"block_sparse_moe.experts.{e}.w2.weight")]
    return names


def llama_tensor_shapes(config: ModelConfig, family: str = MODEL_TYPE) -> dict[str, tuple[int, ...]]:
    """The shape of every LlamaForCausalLM weight for `config` (lm_head only when untied)."""
    h, ffn, d = config.hidden_size, config.ffn_size, config.head_dim
    q_rows, kv_rows = config.num_attention_heads * d, config.attention.query_groups(config.num_attention_heads) * d
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if config.output.untie_embeddings_and_output_weights:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    bias = config.add_bias_linear
    if is_apertus(config):
        return {**shapes, **_apertus_shapes(config, q_rows, kv_rows)}
    for i in range(config.num_layers):
        layer = f"model.layers.{i}."
        mlp = (("mlp.gate_proj", (ffn, h), ffn), ("mlp.up_proj", (ffn, h), ffn), ("mlp.down_proj", (h, ffn), h))
        if config.moe_layers()[i]:
            mlp = ()
            shapes.update(_moe_shapes(config, family, layer))
        for name, shape, bias_rows in (("self_attn.q_proj", (q_rows, h), q_rows), ("self_attn.k_proj", (kv_rows, h), kv_rows),
                                       ("self_attn.v_proj", (kv_rows, h), kv_rows), ("self_attn.o_proj", (h, q_rows), h),
                                       *mlp):
            shapes[layer + name + ".weight"] = shape
            if bias or (config.attention.qkv_bias(config.add_bias_linear) and name in ("self_attn.q_proj", "self_attn.k_proj",
                                                                  "self_attn.v_proj")):
                shapes[layer + name + ".bias"] = (bias_rows,)
        shapes[layer + "input_layernorm.weight"] = (h,)
        shapes[layer + "post_attention_layernorm.weight"] = (h,)
    return shapes


def _apertus_shapes(config: ModelConfig, q_rows: int, kv_rows: int) -> dict[str, tuple[int, ...]]:
    """An ApertusForCausalLM's layers (no biases), with XIELUActivation's two scalars and two buffers."""
    h, ffn, d = config.hidden_size, config.ffn_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(config.num_layers):
        layer = f"model.layers.{i}."
        shapes.update({layer + name: shape for name, shape in (
            ("self_attn.q_proj.weight", (q_rows, h)), ("self_attn.k_proj.weight", (kv_rows, h)),
            ("self_attn.v_proj.weight", (kv_rows, h)), ("self_attn.o_proj.weight", (h, q_rows)),
            ("self_attn.q_norm.weight", (d,)), ("self_attn.k_norm.weight", (d,)),
            ("attention_layernorm.weight", (h,)), ("feedforward_layernorm.weight", (h,)),
            ("mlp.up_proj.weight", (ffn, h)), ("mlp.down_proj.weight", (h, ffn)),
            ("mlp.act_fn.alpha_p", (1,)), ("mlp.act_fn.alpha_n", (1,)), ("mlp.act_fn.beta", ()),
            ("mlp.act_fn.eps", ()))})
    return shapes


def _moe_shapes(config: ModelConfig, family: str, layer: str) -> dict[str, tuple[int, ...]]:
    """One MoE layer's weights as a Mixtral or Qwen2-MoE folder holds them."""
    h, experts, ffn = config.hidden_size, config.moe.num_experts, config.moe.ffn_hidden_size
    shapes: dict[str, tuple[int, ...]] = {}
    if family == QWEN2_MOE_TYPE:
        shared = config.moe.shared_expert_intermediate_size
        shapes[layer + "mlp.gate.weight"] = (experts, h)
        shapes[layer + "mlp.shared_expert_gate.weight"] = (1, h)
        for prefix, width in ([("mlp.shared_expert.", shared)] + [(f"mlp.experts.{e}.", ffn) for e in range(experts)]):
            shapes.update({layer + prefix + "gate_proj.weight": (width, h), layer + prefix + "up_proj.weight": (width, h),
                           layer + prefix + "down_proj.weight": (h, width)})
        return shapes
    shapes[layer + "block_sparse_moe.gate.weight"] = (experts, h)
    for e in range(experts):
        for w, shape in (("w1", (ffn, h)), ("w3", (ffn, h)), ("w2", (h, ffn))):
            shapes[f"{layer}block_sparse_moe.experts.{e}.{w}.weight"] = shape
    return shapes
