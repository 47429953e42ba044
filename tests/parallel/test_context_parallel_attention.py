"""Context parallelism's attention (gpt/cp_attention.py) against the whole sequence's: output and dq/dk/dv.

The check TransformerEngine runs for its CP attention (tests/pytorch/attention/run_attention_with_cp.py:
the same q/k/v and output gradient through the full-sequence attention and through the CP ranks' chunks,
`get_batch_on_this_cp_rank`'s layout, then outputs and gradients compared chunk by chunk), for CP 2 and 4 and
both --cp-comm-type all_gather and p2p, on gloo in fp32: each rank's output and its chunks' gradients equal
the full computation's at this rank's chunks r and 2CP-1-r. And the same for `a2a`, DeepSpeed-Ulysses' head
split (DeepSpeed's tests/unit/sequence_parallelism checks its loss against the run without it), with key/value
heads that divide by CP and ones that do not (grouped-query 2 and 1 at CP 4). `p2p` runs the ring's own backward
(K/V and their gradient accumulators round the ring again); `p2p-autograd` the ring autograd differentiates,
which runs under attention dropout. `a2a+p2p` (hierarchical: the all-to-all over adjacent CP ranks, the ring over
the others) at CP 4 = 2 x 2.
"""

import pytest
import torch
import torch.nn.functional as F

from gpt.cp_attention import context_parallel_attention, ring_attention_through_autograd
from parallel.context_parallel import chunk_ids, cp_ranks, hierarchical_cp_ranks, local_positions, take_local_chunks
from parallel.state import destroy, initialize
from tests.distributed import run_distributed

BATCH, HEADS, SEQ, DIM = 2, 4, 32, 8


def _inputs(kv_heads=HEADS):
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(BATCH, HEADS, SEQ, DIM, generator=generator)
    k = torch.randn(BATCH, kv_heads, SEQ, DIM, generator=generator)
    v = torch.randn(BATCH, kv_heads, SEQ, DIM, generator=generator)
    grad = torch.randn(BATCH, HEADS, SEQ, DIM, generator=generator)
    return q, k, v, grad


def _full(kv_heads, attn_mask=None):
    """The whole sequence through SDPA: causal, or under `attn_mask` (a window's, the documents')."""
    q, k, v, grad = _inputs(kv_heads)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                         enable_gqa=kv_heads != HEADS)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def _cp_rank(rank, world_size, comm_type, kv_heads):
    state = initialize("cpu", context_parallel_size=world_size)
    try:
        q, k, v, grad = _inputs(kv_heads)
        local = [take_local_chunks(t, world_size, state.context_parallel_rank, dim=2).clone().requires_grad_()
                 for t in (q, k, v)]
        if comm_type == "p2p-autograd":  # the ring as it runs with attention dropout, here at dropout 0
            # as ring_attention hands it grouped-query K/V: one head per query head (query head i reads group
            # i // (HEADS / kv_heads)), the repeat's backward summing each group's gradients
            query, key, value = local
            key, value = (t.repeat_interleave(HEADS // kv_heads, dim=1) for t in (key, value))
            out = ring_attention_through_autograd(query, key, value, cp_ranks(state))
        else:
            out = context_parallel_attention(*local, state, comm_type, enable_gqa=kv_heads != HEADS)
        out.backward(take_local_chunks(grad, world_size, state.context_parallel_rank, dim=2))
        # numpy arrays: tensors would travel back as shared memory the exiting child takes with it
        return [t.numpy() for t in (out.detach(), *(t.grad for t in local))]
    finally:
        destroy(state)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("comm_type", ["all_gather", "p2p", "a2a", "p2p-autograd"])
@pytest.mark.parametrize("kv_heads", [HEADS, 2, 1])
def test_output_and_gradients_equal_the_full_sequence(cp, comm_type, kv_heads):
    full = _full(kv_heads)
    results = run_distributed(_cp_rank, cp, comm_type, kv_heads, timeout=120)
    for rank, pieces in enumerate(results):
        for name, got, whole in zip(("out", "dq", "dk", "dv"), pieces, full):
            want = take_local_chunks(whole, cp, rank, dim=2)
            torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6, msg=f"CP {cp} rank {rank} {name}")


def test_each_rank_keeps_chunks_r_and_2cp_minus_1_minus_r():
    """megatron/training/utils.py get_batch_on_this_cp_rank: index [cp_rank, 2 * cp_size - cp_rank - 1]."""
    tokens = torch.arange(16).view(1, 16)
    assert chunk_ids(4, 1) == (1, 6)
    assert take_local_chunks(tokens, 2, 0).tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
    assert take_local_chunks(tokens, 2, 1).tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    assert local_positions(8, 2, 1, torch.device("cpu")).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    every = torch.cat([take_local_chunks(tokens, 4, r) for r in range(4)], dim=1)
    assert sorted(every.flatten().tolist()) == list(range(16))


# ---- attention sinks (--softmax-type, gpt/attention_sinks.py) on every path --------------------------------------

def _sinks():
    return torch.randn(HEADS, generator=torch.Generator().manual_seed(5))


def _full_with_sinks(kv_heads):
    """The whole sequence through Megatron-Core's SoftmaxOne (fused_softmax.py: the sink appended as one more column
    of the scores, dropped after the softmax), written out here as the reference."""
    q, k, v, grad = _inputs(kv_heads)
    q, k, v, sinks = (t.clone().requires_grad_() for t in (q, k, v, _sinks()))
    keys, values = (t.repeat_interleave(HEADS // kv_heads, dim=1) for t in (k, v))
    scores = (q @ keys.transpose(-2, -1)) / DIM ** 0.5
    scores = scores.masked_fill(~torch.ones(SEQ, SEQ, dtype=torch.bool).tril(), float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(BATCH, -1, SEQ, -1)
    out = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ values
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad, sinks.grad


def _cp_rank_with_sinks(rank, world_size, comm_type, kv_heads):
    state = initialize("cpu", context_parallel_size=world_size)
    try:
        q, k, v, grad = _inputs(kv_heads)
        local = [take_local_chunks(t, world_size, state.context_parallel_rank, dim=2).clone().requires_grad_()
                 for t in (q, k, v)]
        sinks = _sinks().requires_grad_()
        if comm_type == "p2p-autograd":
            query, key, value = local
            key, value = (t.repeat_interleave(HEADS // kv_heads, dim=1) for t in (key, value))
            out = ring_attention_through_autograd(query, key, value, cp_ranks(state), sinks=sinks)
        else:
            out = context_parallel_attention(*local, state, comm_type, enable_gqa=kv_heads != HEADS, sinks=sinks)
        out.backward(take_local_chunks(grad, world_size, state.context_parallel_rank, dim=2))
        return [t.numpy() for t in (out.detach(), *(t.grad for t in local), sinks.grad)]
    finally:
        destroy(state)


@pytest.mark.parametrize("comm_type", ["all_gather", "p2p", "a2a", "p2p-autograd"])
def test_attention_sinks_output_and_gradients_equal_the_full_sequence(comm_type):
    """CP 2 with grouped-query K/V: each rank's output and q/k/v gradients are the full SoftmaxOne attention's at its
    chunks, and the sinks' gradients summed over the CP ranks (as the data-parallel x CP reduction sums them) are
    the full one's."""
    kv_heads = 2
    full = _full_with_sinks(kv_heads)
    results = run_distributed(_cp_rank_with_sinks, 2, comm_type, kv_heads, timeout=120)
    for rank, pieces in enumerate(results):
        for name, got, whole in zip(("out", "dq", "dk", "dv"), pieces, full):
            want = take_local_chunks(whole, 2, rank, dim=2)
            torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6, msg=f"rank {rank} {name}")
    summed = sum(torch.from_numpy(pieces[4]) for pieces in results)
    torch.testing.assert_close(summed, full[4], rtol=1e-5, atol=1e-6)


WINDOW = 5  # keys before each query: shorter than a rank's chunks (8) and than the sequence
# the scores' rules beside the window: none, or Gemma 2's scale and soft-capping (gpt/attention_softcap.py)
# or GPT-OSS's sinks at Gemma's scale (both on all_gather's and a2a's masked path: gpt/cp_attention.py)
SCORE_RULES = {"window": {}, "window-scale-softcap": {"scale": 0.3, "softcap": 2.0},
               "window-scale-sinks": {"scale": 0.3, "sinks": True}}


def _full_windowed(kv_heads, rule):
    from gpt.attention_softcap import softcapped_attention
    from gpt.attention_window import causal_window_mask

    mask = causal_window_mask(SEQ, WINDOW, torch.device("cpu"))
    if not rule:
        return _full(kv_heads, mask)
    q, k, v, grad = _inputs(kv_heads)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    if rule.get("sinks"):  # SoftmaxOne's sink column beside the window's scores, as _full_with_sinks
        keys, values = (t.repeat_interleave(HEADS // kv_heads, dim=1) for t in (k, v))
        scores = (q @ keys.transpose(-2, -1) * rule["scale"]).masked_fill(~mask, float("-inf"))
        sink = _sinks().reshape(1, -1, 1, 1).expand(BATCH, -1, SEQ, -1)
        out = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ values
    else:
        out = softcapped_attention(q, k, v, rule["softcap"], rule["scale"], mask)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def _windowed_cp_rank(rank, world_size, comm_type, kv_heads, rule):
    state = initialize("cpu", context_parallel_size=world_size)
    try:
        q, k, v, grad = _inputs(kv_heads)
        local = [take_local_chunks(t, world_size, state.context_parallel_rank, dim=2).clone().requires_grad_()
                 for t in (q, k, v)]
        extra = {**rule, "sinks": _sinks()} if rule.get("sinks") else rule
        out = context_parallel_attention(*local, state, comm_type, enable_gqa=kv_heads != HEADS, window=WINDOW,
                                         **extra)
        out.backward(take_local_chunks(grad, world_size, state.context_parallel_rank, dim=2))
        return [t.numpy() for t in (out.detach(), *(t.grad for t in local))]
    finally:
        destroy(state)


@pytest.mark.parametrize("rule", sorted(SCORE_RULES))
@pytest.mark.parametrize("comm_type", ["all_gather", "a2a"])
def test_a_sliding_window_over_the_ranks_chunks_equals_the_full_sequences(comm_type, rule):
    """--window-size under context parallelism: the window by global positions (gpt/attention_window.py), with
    grouped-query key/value heads, with --softmax-scale and --attn-logit-softcapping's explicit scores, and with
    --softmax-scale beside --softmax-type's sinks; the ring
    (p2p) is refused with any of them (arguments/config.py)."""
    cp, kv_heads = 2, 2
    full = _full_windowed(kv_heads, SCORE_RULES[rule])
    for rank, pieces in enumerate(run_distributed(_windowed_cp_rank, cp, comm_type, kv_heads, SCORE_RULES[rule],
                                                  timeout=120)):
        for name, got, whole in zip(("out", "dq", "dk", "dv"), pieces, full):
            torch.testing.assert_close(torch.from_numpy(got), take_local_chunks(whole, cp, rank, dim=2), rtol=1e-5,
                                       atol=1e-6, msg=f"{comm_type} {rule} rank {rank} {name}")


# ---- --reset-attention-mask's documents (data/documents_cp.py: the whole sample's document ids on every rank) ----

EOD = 99


def _document_tokens():
    """Two samples of SEQ tokens with end-of-document tokens at irregular places: documents of 1 to 13 tokens,
    some inside one chunk of CP 4 (4 tokens), some across chunks and across ranks, and the first token an EOD
    (a one-token document)."""
    tokens = torch.zeros(BATCH, SEQ, dtype=torch.long)
    for row, ends in enumerate(([0, 3, 4, 17, 30], [12, 13, 14, 27])):
        tokens[row, ends] = EOD
    return tokens


def _full_documents(kv_heads):
    """The single process's attention: SDPA under data/documents.py's dense block-diagonal causal mask."""
    from data.documents import DocumentMasking

    return _full(kv_heads, DocumentMasking.of(EOD, False, True, False).masks(_document_tokens()).attention_mask)


def _documents_cp_rank(rank, world_size, comm_type, kv_heads):
    from data.documents import DocumentMasking
    from data.documents_cp import masks_on_this_rank

    state = initialize("cpu", context_parallel_size=world_size)
    try:
        masks = masks_on_this_rank(DocumentMasking.of(EOD, False, True, False), _document_tokens(), _document_tokens(),
                                   world_size, state.context_parallel_rank)
        assert masks.attention_mask is None  # the [S, S] mask is not built under CP
        q, k, v, grad = _inputs(kv_heads)
        local = [take_local_chunks(t, world_size, state.context_parallel_rank, dim=2).clone().requires_grad_()
                 for t in (q, k, v)]
        if comm_type == "p2p-autograd":
            query, key, value = local
            key, value = (t.repeat_interleave(HEADS // kv_heads, dim=1) for t in (key, value))
            out = ring_attention_through_autograd(query, key, value, cp_ranks(state), document_ids=masks.document_ids)
        else:
            out = context_parallel_attention(*local, state, comm_type, enable_gqa=kv_heads != HEADS,
                                             document_ids=masks.document_ids)
        out.backward(take_local_chunks(grad, world_size, state.context_parallel_rank, dim=2))
        return [t.numpy() for t in (out.detach(), *(t.grad for t in local))]
    finally:
        destroy(state)


@pytest.mark.parametrize("comm_type", ["all_gather", "p2p", "a2a", "p2p-autograd"])
def test_documents_over_the_ranks_chunks_equal_the_full_sequences_block_diagonal_attention(comm_type):
    """--reset-attention-mask under context parallelism, CP 4 with grouped-query K/V: each rank's output and q/k/v
    gradients are the full sequence's under the dense block-diagonal mask, at the rank's chunks. At CP 4 the ring's
    blocks hold rows that see no key of the block (their document starts later), which weigh 0 in the merge."""
    cp, kv_heads = 4, 2
    full = _full_documents(kv_heads)
    plain = _full(kv_heads)[0]
    assert not torch.allclose(full[0], plain, atol=1e-3)  # the documents change the attention
    for rank, pieces in enumerate(run_distributed(_documents_cp_rank, cp, comm_type, kv_heads, timeout=120)):
        for name, got, whole in zip(("out", "dq", "dk", "dv"), pieces, full):
            torch.testing.assert_close(torch.from_numpy(got), take_local_chunks(whole, cp, rank, dim=2), rtol=1e-5,
                                       atol=1e-6, msg=f"{comm_type} rank {rank} {name}")


# ---- --cp-comm-type a2a+p2p over --hierarchical-context-parallel-sizes 2 2 -------------------------------------------

HIERARCHICAL_CASES = {"plain": {}, "gqa": {"kv_heads": 2}, "documents": {"kv_heads": 2, "documents": True},
                      "sinks": {"kv_heads": 2, "sinks": True}}


def _hierarchical_rank(rank, world_size):
    """Every case of HIERARCHICAL_CASES on one CP 4 = 2 (all-to-all) x 2 (ring) group."""
    from data.documents import DocumentMasking
    from data.documents_cp import masks_on_this_rank

    state = initialize("cpu", context_parallel_size=world_size, hierarchical_context_parallel_sizes=[2, 2])
    results = {}
    try:
        inner, outer = hierarchical_cp_ranks(state)
        cp_rank = state.context_parallel_rank
        # Megatron-Core's groups: the all-to-all over adjacent CP ranks, the ring over those 2 apart
        results["groups"] = (inner.global_ranks, outer.global_ranks, inner.rank, outer.rank)
        for name, case in HIERARCHICAL_CASES.items():
            kv_heads = case.get("kv_heads", HEADS)
            q, k, v, grad = _inputs(kv_heads)
            local = [take_local_chunks(t, world_size, cp_rank, dim=2).clone().requires_grad_() for t in (q, k, v)]
            sinks = _sinks().requires_grad_() if case.get("sinks") else None
            document_ids = None
            if case.get("documents"):
                document_ids = masks_on_this_rank(DocumentMasking.of(EOD, False, True, False), _document_tokens(),
                                                  _document_tokens(), world_size, cp_rank).document_ids
            out = context_parallel_attention(*local, state, "a2a+p2p", enable_gqa=kv_heads != HEADS, sinks=sinks,
                                             document_ids=document_ids)
            out.backward(take_local_chunks(grad, world_size, cp_rank, dim=2))
            results[name] = [t.numpy() for t in (out.detach(), *(t.grad for t in local),
                                                 *(() if sinks is None else (sinks.grad,)))]
        return results
    finally:
        destroy(state)


def test_hierarchical_a2a_p2p_output_and_gradients_equal_the_full_sequence():
    """TransformerEngine's a2a+p2p (context_parallel.py AttnFuncWithCPAndKVP2P with cp_group = [a2a, p2p]) at CP 4 =
    2 x 2, one launch: each rank's output and q/k/v gradients are the full sequence's at its chunks, for MHA,
    grouped-query K/V (2 groups: one per all-to-all rank), --reset-attention-mask's documents (the ring's blocks
    over the documents' ids by the outer layout) and sinks (their gradient summed over the ranks)."""
    fulls = {"plain": _full(HEADS), "gqa": _full(2), "documents": _full_documents(2), "sinks": _full_with_sinks(2)}
    results = run_distributed(_hierarchical_rank, 4, timeout=180)
    assert [r["groups"] for r in results] == [((0, 1), (0, 2), 0, 0), ((0, 1), (1, 3), 1, 0),
                                              ((2, 3), (0, 2), 0, 1), ((2, 3), (1, 3), 1, 1)]
    for name, full in fulls.items():
        for rank, pieces in enumerate(r[name] for r in results):
            for label, got, whole in zip(("out", "dq", "dk", "dv"), pieces, full):
                torch.testing.assert_close(torch.from_numpy(got), take_local_chunks(whole, 4, rank, dim=2),
                                           rtol=1e-5, atol=1e-6, msg=f"{name} rank {rank} {label}")
    summed = sum(torch.from_numpy(r["sinks"][4]) for r in results)
    torch.testing.assert_close(summed, fulls["sinks"][4], rtol=1e-5, atol=1e-6)


# ---- multi-latent attention's shape: values narrower than queries and keys, its own softmax scale -----------------

MLA_QK, MLA_V, MLA_SCALE = 12, 6, 0.3  # qk_head_dim + qk_pos_emb_head_dim, v_head_dim, mscale^2 / sqrt(q width)
# "-padded": the values zero-padded to the queries' width at the SDPA call (as on CUDA), after the exchanges
MLA_PATHS = ("all_gather", "p2p", "a2a", "a2a+p2p", "p2p-autograd", "all_gather-padded", "a2a-padded")


def _mla_inputs():
    generator = torch.Generator().manual_seed(5)
    q, k = (torch.randn(BATCH, HEADS, SEQ, MLA_QK, generator=generator) for _ in range(2))
    v, grad = (torch.randn(BATCH, HEADS, SEQ, MLA_V, generator=generator) for _ in range(2))
    return q, k, v, grad


def _mla_rank(rank, world_size):
    """Every --cp-comm-type on one CP 4 = 2 (all-to-all) x 2 (ring) group."""
    state = initialize("cpu", context_parallel_size=world_size, hierarchical_context_parallel_sizes=[2, 2])
    results = {}
    try:
        q, k, v, grad = _mla_inputs()
        for path in MLA_PATHS:
            local = [take_local_chunks(t, world_size, state.context_parallel_rank, dim=2).clone().requires_grad_()
                     for t in (q, k, v)]
            if path == "p2p-autograd":
                out = ring_attention_through_autograd(*local, cp_ranks(state), scale=MLA_SCALE)
            else:
                comm_type, padded = path.removesuffix("-padded"), path.endswith("-padded")
                out = context_parallel_attention(*local, state, comm_type, scale=MLA_SCALE, pad_value=padded)
            out.backward(take_local_chunks(grad, world_size, state.context_parallel_rank, dim=2))
            results[path] = [t.numpy() for t in (out.detach(), *(t.grad for t in local))]
        return results
    finally:
        destroy(state)


def test_mla_shaped_attention_equals_the_full_sequence_on_every_comm_type():
    """Multi-latent attention under CP (gpt/mla.py): q and k 12 wide, v 6 wide, scores at MLA's scale (not
    1/sqrt(12)). TransformerEngine's context-parallel attention takes the same (its ring passes K and V as one flat
    buffer, `torch.cat((k.view(-1), v.view(-1)))`, as the ring here does). CP 4, one launch, every path (all_gather
    and a2a also with the values padded at the kernel, as on CUDA): each rank's output and q/k/v gradients are the
    full sequence's at its chunks."""
    q, k, v, grad = (t.clone().requires_grad_() for t in _mla_inputs())
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=MLA_SCALE)
    out.backward(grad.detach())
    full = (out.detach(), q.grad, k.grad, v.grad)
    unscaled = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(unscaled, out, atol=1e-3)  # the scale matters
    results = run_distributed(_mla_rank, 4, timeout=180)
    for path in MLA_PATHS:
        for rank, pieces in enumerate(r[path] for r in results):
            for label, got, whole in zip(("out", "dq", "dk", "dv"), pieces, full):
                torch.testing.assert_close(torch.from_numpy(got), take_local_chunks(whole, 4, rank, dim=2),
                                           rtol=1e-5, atol=1e-6, msg=f"{path} rank {rank} {label}")
