"""No attention path ends in a kernel-selection traceback on the CPU (issue 60 item 3, issue 64 item 3).

Megatron-LM's own Megatron-FSDP DeepSeek-V3 example (examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh: MLA with
--qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128, --bf16, --use-flash-attn) ended on the CPU in
gpt/mla.py's mla_core_attention with SDPA's "No available kernel": --use-flash-attn restricts SDPA to its flash
kernel, whose CPU kernel too takes one head width for q, k and v, and MLA's queries are 192 wide, its values 128.
The values are now zero-padded to the query width for the flash kernel on every device (gpt/mla.py
value_needs_padding), as Megatron-Core pads them for its fused kernels (_prepare_mla_core_attention_value).

Every attention path here (GPT's multi-head and grouped-query attention, MLA, a sliding window, attention sinks,
soft-capped scores; the causal flag and a document mask;
context parallelism's ring, all-gather and all-to-all) x every --attention-backend x fp32, bf16 and fp16 x head
widths that are odd, not a multiple of 8, and MLA's unequal query and value widths: one layer's forward and
backward runs, or the backend this device lacks is refused (or falls back) in one line before any work, as a run
resolves it (gpt/attention_backend.py backend_for_device). In fp32 every backend gives the math kernel's loss.
"""

from __future__ import annotations

import pytest
import torch

from base.errors import ConfigError
from base.options import replace_settings
from data.documents import DocumentMasking
from gpt.attention_backend import backend_for_device
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from parallel.context_parallel import take_local_chunks
from parallel.state import ParallelState, destroy, initialize
from tests.distributed import run_distributed

CPU = ParallelState(device=torch.device("cpu"))
BACKENDS = ("auto", "flash", "fused", "unfused", "local")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VOCAB, SEQ, EOD = 64, 16, 63
MLA = dict(multi_latent_attention=True, position_embedding_type="rope", normalization="RMSNorm")
PATHS = {
    # multi-head attention: head width 7 (odd), and 12 (not a multiple of 8)
    "mha-head7": dict(hidden_size=28, num_attention_heads=4),
    "mha-head12": dict(hidden_size=48, num_attention_heads=4),
    # grouped-query attention: 2 groups of width 7; one group of width 5 (--kv-channels) under a wider hidden
    "gqa-head7": dict(hidden_size=28, num_attention_heads=4, num_query_groups=2),
    "gqa-head5": dict(hidden_size=40, num_attention_heads=4, num_query_groups=1, kv_channels=5),
    # MLA: queries 12 + 4 wide, values 8 (DeepSeek-V3's 128 + 64 against 128, shrunk); odd widths 7 + 2 and 5
    "mla-q16-v8": dict(hidden_size=32, num_attention_heads=4, kv_lora_rank=8, qk_head_dim=12, qk_pos_emb_head_dim=4,
                       v_head_dim=8, **MLA),
    "mla-q9-v5": dict(hidden_size=32, num_attention_heads=4, kv_lora_rank=8, qk_head_dim=7, qk_pos_emb_head_dim=2,
                      v_head_dim=5, q_lora_rank=6, **MLA),
    # the block features of issue 63's families, each a mask or a term SDPA must take: a sliding window of 3 keys
    # (Mistral's, Gemma's), attention sinks (GPT-OSS's learnable softmax), Gemma 2's soft-capped scores
    "window-head7": dict(hidden_size=28, num_attention_heads=4, num_query_groups=2, window_size=(3, 0)),
    "sinks-head7": dict(hidden_size=28, num_attention_heads=4, softmax_type="learnable"),
    "softcap-head12": dict(hidden_size=48, num_attention_heads=4, attn_logit_softcapping=50.0),
}


def layer_config(path: str, backend: str, dropout: float = 0.0) -> ModelConfig:
    return ModelConfig.of(num_layers=1, seq_length=SEQ, max_position_embeddings=SEQ, vocab_size=VOCAB, hidden_dropout=0.0,
                       attention_dropout=dropout, attention_backend=backend, **PATHS[path])


def tokens() -> torch.Tensor:
    batch = torch.randint(0, EOD, (2, SEQ + 1), generator=torch.Generator().manual_seed(0))
    batch[:, 5] = EOD  # two documents in each row
    return batch


def one_step(config: ModelConfig, dtype: str, documents: bool, state: ParallelState = CPU) -> float:
    """One layer's forward and backward as a run on `state` takes it; the loss (fp32)."""
    model = build_gpt_model(config, state, seed=1, dtype=DTYPES[dtype])
    batch = tokens()
    inputs, labels = batch[:, :-1], batch[:, 1:]
    masks = DocumentMasking.of(EOD, False, True, False).masks(inputs) if documents else None
    if state.context_parallel_size > 1:
        inputs, labels = (take_local_chunks(t, state.context_parallel_size, state.context_parallel_rank, dim=1)
                          for t in (inputs, labels))
    loss = model(inputs, labels, documents=masks).float().mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    return loss.item()


def resolved(config: ModelConfig, dtype: str, documents: bool) -> ModelConfig | None:
    """The backend a run on this CPU takes (training/run_settings.py resolve_attention_backend), or None where the
    settings are refused, in one line, before any work."""
    try:
        config.validate()
    except ConfigError as error:
        assert "\n" not in str(error)
        return None
    backend, _ = backend_for_device(config, dtype, torch.device("cpu"), attention_mask=documents)
    return replace_settings(config, attention_backend=backend)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_attention_path_runs_at_every_dtype_and_head_width(path, backend, dtype):
    """Before: each MLA path under --attention-backend flash (--use-flash-attn) ended in "No available kernel"."""
    for documents in (False, True):
        for dropout in (0.0, 0.1):  # a CPU's flash kernel has no dropout: the run falls back, said in one line
            config = resolved(layer_config(path, backend, dropout), dtype, documents)
            if config is not None:
                assert torch.isfinite(torch.tensor(one_step(config, dtype, documents))), (documents, dropout)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_backend_gives_the_math_kernels_loss_in_fp32(path):
    """A backend is a kernel, never the math: the padded values of MLA's flash path change no number beyond the
    kernels' own rounding (their sums run in another order)."""
    for documents in (False, True):
        reference = one_step(resolved(layer_config(path, "unfused"), "fp32", documents), "fp32", documents)
        for backend in BACKENDS:
            loss = one_step(resolved(layer_config(path, backend), "fp32", documents), "fp32", documents)
            assert loss == pytest.approx(reference, rel=1e-6), (backend, documents)


CP_PATHS = ("mha-head7", "gqa-head7", "gqa-head5", "window-head7", "sinks-head7")


def _context_parallel_paths(rank, world_size):
    """Every CP comm type x backend x dtype x head width on this rank; the failures, as text."""
    state = initialize("cpu", context_parallel_size=world_size)
    failures = []
    try:
        for comm_type in ("p2p", "all_gather", "a2a"):
            for path in CP_PATHS:
                for backend in BACKENDS:
                    for dtype in DTYPES:
                        config = resolved(replace_settings(layer_config(path, backend), cp_comm_type=comm_type),
                                          dtype, documents=False)
                        if config is None or (comm_type == "p2p" and config.has_windows()):
                            continue  # the ring with a window: refused in one line at launch (arguments/config.py)
                        try:
                            one_step(config, dtype, documents=False, state=state)
                        except Exception as error:  # noqa: BLE001 - every failure is reported, not the first
                            failures.append(f"{comm_type} {path} {backend} {dtype}: {type(error).__name__}: {error}")
        return failures
    finally:
        destroy(state)


@pytest.mark.slow
def test_context_parallel_attention_runs_at_every_backend_dtype_and_head_width():
    """The ring (its own backward, fp32 scores), the all-gather (SDPA under a position mask) and DeepSpeed-Ulysses'
    all-to-all (SDPA over the whole sequence with a share of the heads), 2 ranks, one launch for all of them."""
    for failures in run_distributed(_context_parallel_paths, 2, timeout=300):
        assert failures == []
