"""Megatron-DeepSpeed's GPT at tensor and pipeline size 1 (GPTModel and GPTModelPipe), small enough to train on a CPU
under DeepSpeed's engine, for tests/fixtures/deepspeed_checkpoints. Written here, not imported: Megatron-DeepSpeed
needs its global args, mpu and fused kernels. The forward follows its code where values depend on it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def init_like_megatron(model: nn.Module, seed: int, init_std: float = 0.02) -> None:
    """init_method_normal for the weights; biases 0 and LayerNorm gains 1 (1-D weights)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.zero_()
            elif param.dim() == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * init_std)


class Embedding(nn.Module):
    """language_model.py Embedding: word + position embeddings, [b, s] -> [s, b, h]."""

    def __init__(self, hidden: int, vocab: int, max_positions: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)       # VocabParallelEmbedding's weight [vocab, h]
        self.position_embeddings = nn.Embedding(max_positions, hidden)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        return embeddings.transpose(0, 1).contiguous()

    def state_dict_for_save_checkpoint(self, prefix="", keep_vars=False) -> dict:
        return {"word_embeddings": self.word_embeddings.state_dict(prefix=prefix, keep_vars=keep_vars),
                "position_embeddings": self.position_embeddings.state_dict(prefix=prefix, keep_vars=keep_vars)}


class ParallelAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, block_qkv: bool):
        super().__init__()
        self.heads, self.head_dim, self.block_qkv = heads, hidden // heads, block_qkv
        self.query_key_value = nn.Linear(hidden, 3 * hidden)
        self.dense = nn.Linear(hidden, hidden)  # RowParallelLinear with skip_bias_add: the bias is added after

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seq, batch = hidden.shape[:2]
        mixed = self.query_key_value(hidden)  # [s, b, 3h]
        if self.block_qkv:  # Megatron-DeepSpeed since 676a482c (FPDT): all queries, all keys, all values
            each = mixed.shape[-1] // 3
            query, key, value = (mixed[:, :, i * each:(i + 1) * each].reshape(seq, batch, -1, self.head_dim)
                                 for i in range(3))
        else:  # before it, as Megatron-LM: [s, b, heads, (1 + 2) * head_dim] per head, then split (split_tensor)
            mixed = mixed.view(seq, batch, -1, 3, self.head_dim)
            query, key, value = (mixed[:, :, :, i] for i in range(3))
        context = self.core_attention(query, key, value, mask)
        return F.linear(context, self.dense.weight), self.dense.bias

    def core_attention(self, query, key, value, mask) -> torch.Tensor:
        """CoreAttention.forward: [s, b, heads, d] each -> [s, b, h]."""
        seq, batch, heads, dim = query.shape
        q = query.reshape(seq, batch * heads, dim).transpose(0, 1)
        k = key.reshape(seq, batch * heads, dim).transpose(0, 1)
        scores = torch.baddbmm(torch.empty(batch * heads, seq, seq), q, k.transpose(1, 2), beta=0.0,
                               alpha=1.0 / math.sqrt(dim)).view(batch, heads, seq, seq)
        probs = torch.softmax(scores.masked_fill(mask, -10000.0).float(), dim=-1)
        v = value.reshape(seq, batch * heads, dim).transpose(0, 1)
        context = torch.bmm(probs.view(batch * heads, seq, seq), v).view(batch, heads, seq, dim)
        return context.permute(2, 0, 1, 3).reshape(seq, batch, heads * dim)


class ParallelMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(hidden, ffn)
        self.dense_4h_to_h = nn.Linear(ffn, hidden)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        intermediate = F.linear(hidden, self.dense_h_to_4h.weight) + self.dense_h_to_4h.bias
        # exact GeLU, as --no-bias-gelu-fusion (bias_gelu_fusion=False); the fused default is GeLU's tanh form
        return F.linear(F.gelu(intermediate), self.dense_4h_to_h.weight), self.dense_4h_to_h.bias


class ParallelTransformerLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, eps: float, block_qkv: bool):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden, eps=eps)
        self.self_attention = ParallelAttention(hidden, heads, block_qkv)
        self.post_attention_layernorm = nn.LayerNorm(hidden, eps=eps)
        self.mlp = ParallelMLP(hidden, ffn)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attention, bias = self.self_attention(self.input_layernorm(hidden), mask)
        layernorm_input = hidden + (attention + bias)
        mlp, bias = self.mlp(self.post_attention_layernorm(layernorm_input))
        return layernorm_input + (mlp + bias)


class ParallelTransformer(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, eps: float, block_qkv: bool):
        super().__init__()
        self.layers = nn.ModuleList(ParallelTransformerLayer(hidden, heads, ffn, eps, block_qkv)
                                    for _ in range(layers))
        self.final_layernorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden, mask)
        return self.final_layernorm(hidden)


class TransformerLanguageModel(nn.Module):
    def __init__(self, layers, hidden, heads, ffn, vocab, max_positions, eps, block_qkv):
        super().__init__()
        self.embedding = Embedding(hidden, vocab, max_positions)
        self.encoder = ParallelTransformer(layers, hidden, heads, ffn, eps, block_qkv)

    def state_dict_for_save_checkpoint(self, prefix="", keep_vars=False) -> dict:
        return {"embedding": self.embedding.state_dict_for_save_checkpoint(prefix, keep_vars),
                "encoder": self.encoder.state_dict(prefix=prefix, keep_vars=keep_vars)}


class GPTModel(nn.Module):
    """gpt_model.py GPTModel at pipeline size 1: the output layer is the word embedding (tied)."""

    def __init__(self, layers: int, hidden: int, heads: int, vocab: int, max_positions: int, eps: float = 1e-5,
                 block_qkv: bool = True, init_std: float = 0.02, seed: int = 0):
        super().__init__()
        self.language_model = TransformerLanguageModel(layers, hidden, heads, 4 * hidden, vocab, max_positions,
                                                       eps, block_qkv)
        init_like_megatron(self, seed, init_std)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The batch's mean token loss (pretrain_gpt.py loss_func with every token in the loss mask)."""
        batch, seq = input_ids.shape
        positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1).view(1, 1, seq, seq)
        hidden = self.language_model.encoder(self.language_model.embedding(input_ids, positions), mask)
        logits = F.linear(hidden, self.language_model.embedding.word_embeddings.weight)  # [s, b, vocab]
        losses = F.cross_entropy(logits.float().transpose(0, 1).reshape(batch * seq, -1), labels.reshape(-1),
                                 reduction="none")
        return losses.sum() / losses.numel()

    def state_dict_for_save_checkpoint(self, prefix="", keep_vars=False) -> dict:
        return {"language_model": self.language_model.state_dict_for_save_checkpoint(prefix, keep_vars)}

    def load_state_dict(self, state_dict, strict=True, **kwargs):
        """GPTModel.load_state_dict -> TransformerLanguageModel's -> Embedding's and the encoder's: the nested dict
        `state_dict_for_save_checkpoint` made, read back by its keys."""
        def flatten(tree: dict, prefix: str = "") -> dict:
            flat = {}
            for key, value in tree.items():
                flat.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
            return flat
        return super().load_state_dict(flatten(state_dict), strict=strict, **kwargs)


# ---- GPTModelPipe: Megatron-DeepSpeed's default module (a run without --no-pipeline-parallel) ------------------------

class EmbeddingPipe(Embedding):
    """language_model.py EmbeddingPipe with args.attn_mask set (pretrain_gpt.py sets it for the pipeline): the
    embeddings alone go on; `word_embeddings_weight` is what the tied output layer reads."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
        return super().forward(tokens, positions)

    @property
    def word_embeddings_weight(self) -> torch.Tensor:
        return self.word_embeddings.weight


class ParallelTransformerLayerPipe(ParallelTransformerLayer):
    """transformer.py ParallelTransformerLayerPipe with the static causal mask (args.attn_mask)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        seq = hidden.shape[0]
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1).view(1, 1, seq, seq)
        return super().forward(hidden, mask)


def logits_helper(embedding: EmbeddingPipe, lm_output: torch.Tensor) -> torch.Tensor:
    """gpt_model.py GPTModelPipe's `_logits_helper`: the output layer is the tied word embedding."""
    return F.linear(lm_output, embedding.word_embeddings_weight)


def cross_entropy(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """gpt_model.py CrossEntropy: [s, b, vocab] logits against [b, s] labels, every token in the loss mask."""
    losses = F.cross_entropy(output.float().transpose(0, 1).reshape(-1, output.shape[-1]), labels.reshape(-1),
                             reduction="none")
    return losses.sum() / losses.numel()


def gpt_model_pipe_specs(layers: int, hidden: int, heads: int, vocab: int, max_positions: int, eps: float = 1e-5,
                         block_qkv: bool = True) -> list:
    """GPTModelPipe.specs at fp32 and one pipeline stage: _to_float16 (a no-op), the tied embedding, the layers, the
    final LayerNorm, the tied embedding again as the output layer. Their indices name the parameters
    (`tied_modules.embed.word_embeddings.weight`, `2.self_attention.query_key_value.weight`, `4.weight`, ...)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    def to_float16(inputs):
        return inputs

    embed = ("embed", EmbeddingPipe, hidden, vocab, max_positions)
    return [to_float16, TiedLayerSpec(*embed, tied_weight_attr="word_embeddings_weight"),
            *[LayerSpec(ParallelTransformerLayerPipe, hidden, heads, 4 * hidden, eps, block_qkv) for _ in range(layers)],
            LayerSpec(nn.LayerNorm, hidden, eps=eps),
            TiedLayerSpec(*embed, forward_fn=logits_helper, tied_weight_attr="word_embeddings_weight")]
