"""The model's shape: GPTModel's configuration, beside the model it builds (nanoGPT's GPTConfig).

It imports only torch-free helpers of the floors below (base/, parallel/), so building or inspecting
a model never loads the data pipeline or the flag parser. The run's other settings live in
arguments/config.py, which holds one of these as `PretrainConfig.model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from base.options import Const, flag_of_setting, option
from gpt.architecture import NORMALIZATIONS, Architecture
from parallel.layers import padded_vocab_size

FP8_FORMATS = ("e4m3", "hybrid")  # Megatron-LM's --fp8-format choices

# squared_relu is Megatron-LM's --squared-relu (megatron/core/activations.py: relu(x)^2).
ACTIVATIONS = ("gelu", "gelu_tanh", "squared_relu")


def _normalization_name(text: str) -> str:
    """Megatron-LM spells it RMSNorm, Megatron-DeepSpeed rmsnorm (its --normalization choices are
    layernorm and rmsnorm): either is the same setting."""
    return {name.lower(): name for name in NORMALIZATIONS}.get(text.lower(), text)


def _position_embedding_name(text: str) -> str:
    """Megatron-DeepSpeed's `absolute` is Megatron-LM's learned_absolute."""
    return "learned_absolute" if text == "absolute" else text
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
# Megatron-LM's --cp-comm-type choices (megatron/training/arguments.py)
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


@dataclass
class ModelConfig:
    num_layers: int = option(4, aliases={"--encoder-num-layers": "Megatron-LM (a GPT's only stack)"})
    hidden_size: int = 128
    num_attention_heads: int = 4
    # Megatron-LM's --kv-channels: each head's width (Megatron-Core's kv_channels; transformers' head_dim), so the
    # attention's heads x width may differ from the hidden size (Qwen3's 128 at hidden 2560 / 32 heads).
    kv_channels: Optional[int] = option(None, help="each attention head's width (default: --hidden-size / "
                                                   "--num-attention-heads)")
    # None means 4 x hidden_size, as in GPT-2
    ffn_hidden_size: Optional[int] = option(None, help="default: 4 x hidden size")
    seq_length: int = option(128, aliases={"--encoder-seq-length": "Megatron-LM (a GPT's only sequence)"})
    max_position_embeddings: int = 128
    # Megatron's --vocab-size. Without NullTokenizer it stays 0, and the run plan's resolved copy holds the
    # tokenizer's.
    vocab_size: int = option(0, group="data",
                             help="with --tokenizer-type NullTokenizer: token ids are 0..N-1 and the end-of-document "
                                  "id is N")
    make_vocab_size_divisible_by: int = option(
        128, help="pad the vocabulary to a multiple of this x tensor-parallel size",
        consts=[Const(("--no-pad-vocab-size", "--disable-pad-vocab-size"), 1,
                      help="Megatron-LM: no padding beyond the TP split (--make-vocab-size-divisible-by 1)")])
    pad_vocab_size_to: Optional[int] = option(
        None, flags=("--pad-vocab-size-to", "--padded-vocab-size"),
        help="the padded vocabulary, exactly (BigScience's --pad-vocab-size-to, Megatron-LM's --padded-vocab-size): "
             "at least the tokenizer's, divisible by the TP size")
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layernorm_epsilon: float = option(1e-5, aliases={"--norm-epsilon": "Megatron-LM"})
    # The blocks beyond GPT-2 (issue 37), named as Megatron-LM's arguments (their dests); what each
    # builds is in gpt/architecture.py. The defaults are GPT-2's blocks.
    normalization: str = option("LayerNorm", type=_normalization_name,
                                help="LayerNorm (GPT-2) or RMSNorm (Llama); Megatron-DeepSpeed's layernorm/rmsnorm too")
    swiglu: bool = option(False, action="store_true",
                          help="SwiGLU MLP (Llama); --ffn-hidden-size defaults to int(4h x 2/3 / 64) x 64")
    position_embedding_type: str = option(
        "learned_absolute", type=_position_embedding_name,
        help="learned_absolute (GPT-2), rope (rotary, Llama) or none; Megatron-DeepSpeed's "
             "--use-rotary-position-embeddings --no-position-embedding is rope")
    rotary_base: float = option(10000.0, aliases={"--rotary-position-embeddings-theta": "Megatron-DeepSpeed"},
                                help="rotary positions' base (theta): 10000 Llama 2, 500000 Llama 3")
    rotary_percent: float = option(1.0, help="the fraction of each head's dims that rotate, in (0, 1]")
    use_rope_scaling: bool = option(False, action="store_true",
                                    help="Llama 3.1's scaling of the rotary frequencies (--rope-scaling-factor)")
    rope_scaling_factor: float = option(8.0, help="with --use-rope-scaling: Llama 3.1's factor")
    rotary_interleaved: bool = option(
        False, action="store_true",
        help="rotary positions rotate adjacent pairs of dims (2i, 2i+1) instead of the two halves (Megatron-LM)")
    num_query_groups: Optional[int] = option(
        None, aliases={"--num-key-value-heads": "Megatron-DeepSpeed"},
        help="key/value heads (grouped-query attention; 1 is multi-query); default: one per attention head. "
             "Megatron-LM reads it only with --group-query-attention, which is refused without it here")
    untie_embeddings_and_output_weights: bool = option(
        False, action="store_true", help="an output layer of its own instead of the token embedding's (Llama)")
    add_bias_linear: bool = option(
        True, consts=[Const(("--disable-bias-linear",), False, help="Megatron-LM: linears without biases (Llama)")],
        help="biases in every linear layer, as in GPT-2")
    add_qkv_bias: bool = option(False, action="store_true",
                                help="keep the query-key-value bias when --disable-bias-linear drops the others (Qwen)")
    qk_layernorm: bool = option(False, action="store_true",
                                help="--normalization over each query and key head before attention (Qwen3)")
    attention_output_gate: bool = option(
        False, action="store_true",
        help="the QKV projection also yields a gate per query head; attention's output is multiplied by its "
             "sigmoid before the output projection (Megatron-LM, Qwen3-Next)")
    # Megatron's --sequence-parallel (gpt/model.py): with TP 1 there is nothing to split and it has no effect.
    sequence_parallel: bool = option(
        False, action="store_true", group="training",
        help="with --tensor-model-parallel-size > 1: norms, dropout and the residual stream hold 1/TP of the "
             "sequence (all-gather before, reduce-scatter after each TP region, in place of the all-reduces); "
             "--seq-length must be divisible by the TP size")
    init_method_std: float = 0.02
    # "gelu_tanh" is "gelu_new" in transformers.
    activation: str = option("gelu_tanh", choices=ACTIVATIONS,
                             help="gelu_tanh is GPT-2's approximation, gelu the exact erf form, squared_relu "
                                  "relu(x)^2 (Megatron-LM's --squared-relu)")
    # Megatron's --attention-backend; Megatron's other names for its values are SPELLINGS in
    # arguments/megatron/flags.py (--use-flash-attn).
    attention_backend: str = option(
        "auto", choices=ATTENTION_BACKENDS,
        help="the SDPA kernel (Megatron's names): flash = flash attention, fused = cuDNN or the memory-efficient "
             "kernel, unfused/local = the math kernel, auto = PyTorch's choice")
    # Megatron-Core's TransformerConfig.cp_comm_type (gpt/cp_attention.py); only read with --context-parallel-size > 1.
    # Megatron takes one value, or one per layer (nargs "+"); here one, for every layer.
    cp_comm_type: str = option(
        "p2p", choices=CP_COMM_TYPES, group="training",
        help="with --context-parallel-size > 1, how attention reaches the other ranks' keys and values: p2p (the "
             "ring, partial softmaxes merged) or all_gather (gathered once), for every layer; a2a and a2a+p2p "
             "are refused")
    # Issue 40's lever 1 (gpt/attention_padding.py): acts only on CUDA, so CPU math is unchanged.
    pad_attention_head_dim: bool = option(
        True, help="on CUDA, zero-pad a head dim that is not a multiple of 8 (the paper's 1.5B: 100 -> 104) so "
                   "SDPA's fused kernels take it; the attention is the same (scale 1/sqrt(original head dim)); "
                   "no effect on a CPU or with --attention-backend unfused/local")
    # Megatron-LM's --cross-entropy-loss-fusion (there: a fused cross-entropy kernel); here the output
    # layer and the loss fused over token chunks (parallel/fused_linear_cross_entropy.py).
    cross_entropy_loss_fusion: bool = option(
        False, action="store_true",
        help="compute the output layer and the cross entropy together over chunks of tokens, never holding the "
             "full logits (recomputed in the backward); the same loss and gradients to rounding")
    # Megatron-LM's --fp8-format (dest fp8); DeepSpeed-Megatron's --fp8-e4m3 / --fp8-hybrid. gpt/fp8.py
    # checks it before any work.
    fp8: Optional[str] = option(
        None, flags=("--fp8-format",), choices=FP8_FORMATS, group="zero",
        consts=[Const(("--fp8-e4m3",), "e4m3", help="DeepSpeed-Megatron: --fp8-format e4m3"),
                Const(("--fp8-hybrid",), "hybrid", help="DeepSpeed-Megatron: --fp8-format hybrid")],
        help="FP8 training through torchao (CUDA only, requirements-gpu.txt); refused on a CPU, without "
             "torchao, and until it is wired on a GPU (issue 40)")

    @property
    def architecture(self) -> Architecture:
        """The blocks these settings choose, as GPTModel builds them."""
        return Architecture(**{name: getattr(self, name) for name in Architecture.__dataclass_fields__})

    @property
    def ffn_size(self) -> int:
        """--ffn-hidden-size, else Megatron-LM's default: 4h, or SwiGLU's two thirds of it (architecture.py)."""
        return self.architecture.ffn_size(self.hidden_size, self.ffn_hidden_size)

    @property
    def head_dim(self) -> int:
        """--kv-channels, else Megatron-LM's default hidden / heads (validate_args:
        `if args.kv_channels is None: ... args.kv_channels = args.hidden_size // args.num_attention_heads`)."""
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, tensor_parallel_size: int = 1) -> int:
        try:
            return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, tensor_parallel_size,
                                     self.pad_vocab_size_to)
        except ValueError as error:
            raise ConfigError(str(error), flags=("--pad-vocab-size-to", "--tensor-model-parallel-size")) from None

    def validate_tensor_parallel(self, tensor_parallel_size: int) -> None:
        """Each TP rank takes whole attention heads and an equal slice of hidden and 4h."""
        for name, size in (("num_attention_heads", self.num_attention_heads), ("hidden_size", self.hidden_size),
                           ("ffn_hidden_size", self.ffn_size)):
            if size % tensor_parallel_size != 0:
                raise ConfigError(f"{_flag(name)} {size} is not divisible by --tensor-model-parallel-size "
                                  f"{tensor_parallel_size}; each tensor-parallel rank needs an equal share",
                                  flags=(_flag(name), "--tensor-model-parallel-size"))
        self.architecture.validate(self.num_attention_heads, self.hidden_size, self.ffn_hidden_size,
                                   tensor_parallel_size, head_dim=self.head_dim)
        if self.sequence_parallel and self.seq_length % tensor_parallel_size != 0:
            raise ConfigError(f"--sequence-parallel splits the sequence over the tensor-parallel ranks: --seq-length "
                              f"{self.seq_length} is not divisible by --tensor-model-parallel-size "
                              f"{tensor_parallel_size}; choose a multiple of it",
                              flags=("--sequence-parallel", "--seq-length", "--tensor-model-parallel-size"))

    def validate(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "max_position_embeddings", "make_vocab_size_divisible_by"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        if self.ffn_hidden_size is not None and self.ffn_hidden_size < 1:
            raise ConfigError(f"--ffn-hidden-size must be at least 1, got {self.ffn_hidden_size}",
                              flags=("--ffn-hidden-size",))
        if self.kv_channels is not None and self.kv_channels < 1:
            raise ConfigError(f"--kv-channels must be at least 1, got {self.kv_channels}", flags=("--kv-channels",))
        # Megatron-LM asserts the division only where it derives the head width from it (validate_args).
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads != 0:
            raise ConfigError(f"--hidden-size {self.hidden_size} is not divisible by --num-attention-heads "
                              f"{self.num_attention_heads}; choose sizes with hidden = heads x head_dim, or give "
                              f"each head's width with --kv-channels",
                              flags=("--hidden-size", "--num-attention-heads", "--kv-channels"))
        if self.seq_length > self.max_position_embeddings:
            raise ConfigError(f"--seq-length {self.seq_length} is larger than --max-position-embeddings "
                              f"{self.max_position_embeddings}; raise the latter or shorten the sequence",
                              flags=("--seq-length", "--max-position-embeddings"))
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{_flag(name)} must be in [0, 1), got {getattr(self, name)}", flags=(_flag(name),))
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"--activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}",
                              flags=("--activation",))
        if self.activation == "squared_relu" and self.swiglu:
            # Megatron-LM asserts it (core_transformer_config_from_args: `assert not args.swiglu`).
            raise ConfigError("--squared-relu replaces the MLP's activation and --swiglu gates it with SiLU: "
                              "give one of them", flags=("--activation", "--swiglu"))
        if self.init_method_std <= 0 or self.layernorm_epsilon <= 0:
            raise ConfigError("--init-method-std and --layernorm-epsilon must be positive",
                              flags=("--init-method-std", "--layernorm-epsilon"))
        if self.vocab_size < 0:
            raise ConfigError(f"--vocab-size must be at least 1, got {self.vocab_size}", flags=("--vocab-size",))
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"--attention-backend {self.attention_backend!r} is not one of "
                              f"{', '.join(ATTENTION_BACKENDS)}", flags=("--attention-backend",))
        self.architecture.validate(self.num_attention_heads, self.hidden_size, self.ffn_hidden_size,
                                   head_dim=self.head_dim)


def _flag(name: str) -> str:
    return flag_of_setting(ModelConfig, name)
