"""`M` (Mamba-2) and `G` (Gated DeltaNet) layers in Megatron-Core 0.19's torch_dist layout (checkpoint/torch_dist/
names.py), both ways. Megatron-LM cannot run these layers on a CPU (its Mamba needs mamba_ssm's CUDA kernels), so:

- every key, global shape and TP split the writer gives the M and G layers of `MM-*-GG-*E` is the one core_v0.19.0's
  sharded_state_dict functions declare (DECLARED, cited by file and line), and the reader pairs each key back;
- a Gated DeltaNet part holds each head's rows of ours in head order (Megatron-Core's [q|k|v|z|beta|alpha]);
- a save at TP 2 is read at TP 1, and one at TP 1 at TP 2: the resumed fp32 losses equal bitwise those of the same
  state resumed from this project's own save (which reshards exactly), and the uninterrupted run's within the other
  layout's summation order; the TP 2 save's chunks are the per-rank shards Megatron-Core declares.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoint.torch_dist.names import GdnHeads, our_placements

PATTERN = "MM-*-GG-*E"  # blocks M, M-, *-, G, G-, *E: Megatron's layers 0-1 and 5-6 are M and G
MAMBA_LAYERS, GDN_LAYERS = (0, 1), (5, 6)
HIDDEN, MAMBA_HEADS, MAMBA_HEAD_DIM, GROUPS, STATE = 16, 4, 8, 2, 8  # MambaMixer's expand 2: 2 x 16 / 8 heads
KEY_HEADS, VALUE_HEADS, KEY_DIM, VALUE_DIM = 2, 4, 8, 8
FLAGS = ["--hybrid-layer-pattern", PATTERN, "--hidden-size", str(HIDDEN), "--num-attention-heads", "4",
         "--ffn-hidden-size", "32", "--swiglu", "--num-experts", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters",
         "4", "--lr", "0.001", "--min-lr", "0.0001", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1",
         "--weight-decay", "0.1", "--clip-grad", "1.0", "--seed", "1234", "--mock-data", "--tokenizer-type",
         "NullTokenizer", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--eval-iters", "0", "--mamba-head-dim", str(MAMBA_HEAD_DIM),
         "--mamba-num-groups", str(GROUPS), "--mamba-state-dim", str(STATE), "--linear-num-key-heads",
         str(KEY_HEADS), "--linear-num-value-heads", str(VALUE_HEADS), "--linear-key-head-dim", str(KEY_DIM),
         "--linear-value-head-dim", str(VALUE_DIM), "--device", "cpu", "--log-interval", "1"]
TP2 = ("--tensor-model-parallel-size", "2", "--sequence-parallel")  # Megatron-Core's MoE layer needs SP under TP
INNER, BC, CONV = MAMBA_HEADS * MAMBA_HEAD_DIM, GROUPS * STATE, 4
QK, V = KEY_HEADS * KEY_DIM, VALUE_HEADS * VALUE_DIM

# Megatron-Core core_v0.19.0's declarations, inside `decoder.layers.<layer>.`: key -> (global shape, TP axis or
# None where every rank holds it whole).
# `M`: hybrid_layer_specs.py:93-99 (MambaLayer, its norm fused into in_proj: TELayerNormColumnParallelLinear, out_proj
# TERowParallelLinear). ssm/mamba_mixer.py MambaMixer.sharded_state_dict: A_log, dt_bias, D and conv1d_* on axis 0
# (:1350-1356), conv1d_* saved as conv1d.* (:1370-1372), in_proj.weight split into z, x, B, C, dt (:1418-1429) and
# conv1d's into x, B, C (:1476-1485); ExtendedRMSNorm's weight on axis 0 (:116-124). Each part is a key of its own
# (ssm/utils.py:50) whose global rows are the ranks' slices in order (dist_checkpointing/mapping.py:298-307).
# extensions/transformer_engine.py: TELayerNormColumnParallelLinear's weight on axis 0, its layer_norm_* whole
# (:1347-1354); TERowParallelLinear's weight on axis 1 (:1737-1743).
MAMBA_DECLARED = {
    "mixer.in_proj.layer_norm_weight": ((HIDDEN,), None), "mixer.in_proj.layer_norm_bias": ((HIDDEN,), None),
    "mixer.in_proj.weight.z": ((INNER, HIDDEN), 0), "mixer.in_proj.weight.x": ((INNER, HIDDEN), 0),
    "mixer.in_proj.weight.B": ((BC, HIDDEN), 0), "mixer.in_proj.weight.C": ((BC, HIDDEN), 0),
    "mixer.in_proj.weight.dt": ((MAMBA_HEADS, HIDDEN), 0),
    "mixer.conv1d.weight.x": ((INNER, 1, CONV), 0), "mixer.conv1d.weight.B": ((BC, 1, CONV), 0),
    "mixer.conv1d.weight.C": ((BC, 1, CONV), 0), "mixer.conv1d.bias.x": ((INNER,), 0),
    "mixer.conv1d.bias.B": ((BC,), 0), "mixer.conv1d.bias.C": ((BC,), 0),
    "mixer.A_log": ((MAMBA_HEADS,), 0), "mixer.D": ((MAMBA_HEADS,), 0), "mixer.dt_bias": ((MAMBA_HEADS,), 0),
    "mixer.norm.weight": ((INNER,), 0), "mixer.out_proj.weight": ((HIDDEN, INNER), 1),
}
# `G`: hybrid_layer_specs.py:105-115 (a TransformerLayer whose self_attention is GatedDeltaNet, in_proj
# TELayerNormColumnParallelLinear, out_norm TENorm: no sharded_state_dict, so whole; out_proj TERowParallelLinear).
# ssm/gated_delta_net/common.py _GDNBase.sharded_state_dict: A_log and dt_bias on axis 0 (:485-488), conv1d.weight
# on axis 0 (:499), in_proj.weight split by gdn.py's names and sections (gated_delta_net/gdn.py:40-48: query, key,
# value, z, beta, alpha) (:525-530), conv1d.weight into query, key, value (:542-546); no conv bias (conv_bias False).
GDN_DECLARED = {
    "self_attention.in_proj.layer_norm_weight": ((HIDDEN,), None),
    "self_attention.in_proj.layer_norm_bias": ((HIDDEN,), None),
    "self_attention.in_proj.weight.query": ((QK, HIDDEN), 0), "self_attention.in_proj.weight.key": ((QK, HIDDEN), 0),
    "self_attention.in_proj.weight.value": ((V, HIDDEN), 0), "self_attention.in_proj.weight.z": ((V, HIDDEN), 0),
    "self_attention.in_proj.weight.beta": ((VALUE_HEADS, HIDDEN), 0),
    "self_attention.in_proj.weight.alpha": ((VALUE_HEADS, HIDDEN), 0),
    "self_attention.conv1d.weight.query": ((QK, 1, CONV), 0), "self_attention.conv1d.weight.key": ((QK, 1, CONV), 0),
    "self_attention.conv1d.weight.value": ((V, 1, CONV), 0),
    "self_attention.A_log": ((VALUE_HEADS,), 0), "self_attention.dt_bias": ((VALUE_HEADS,), 0),
    "self_attention.out_norm.weight": ((VALUE_DIM,), None), "self_attention.out_norm.bias": ((VALUE_DIM,), None),
    "self_attention.out_proj.weight": ((HIDDEN, V), 1),
}


def declared() -> dict[str, tuple[tuple[int, ...], int | None]]:
    """DECLARED for every M and G layer of PATTERN, under its full key."""
    return {f"decoder.layers.{layer}.{name}": value for layers, table in ((MAMBA_LAYERS, MAMBA_DECLARED),
                                                                          (GDN_LAYERS, GDN_DECLARED))
            for layer in layers for name, value in table.items()}


def _config(*extra: str, flags: list[str] = FLAGS):
    from arguments.parser import parse_config

    return parse_config([*flags, "--ckpt-format", "torch_dist", "--save", "unused", *extra])


def _gpt_path(freq: str) -> list[str]:
    """FLAGS without the pattern (nor its MoE layer): GPTModel's 4 layers, Gated DeltaNet where `freq` says."""
    flags = [flag for at, flag in enumerate(FLAGS) if flag not in ("--hybrid-layer-pattern", PATTERN,
                                                                    "--num-experts") and FLAGS[at - 1] != "--num-experts"]
    return [*flags, "--num-layers", "4", "--experimental-attention-variant", "gated_delta_net",
            "--linear-attention-freq", freq]


def _mixer_key(key: str) -> bool:
    return any(key.startswith(f"decoder.layers.{layer}.") for layer in (*MAMBA_LAYERS, *GDN_LAYERS))


def test_written_keys_and_shapes_are_the_ones_megatron_core_declares_and_read_back():
    from checkpoint.torch_dist.writer import _placements
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    config = _config()
    assert config.megatron_format_unwritten() is None  # M and G layers are written in Megatron-LM's layout
    gdn = GdnHeads.of(config.model.gdn)
    written, taken = {}, []
    for name, parameter in GPTModel(config.model, ParallelState(device=torch.device("cpu"))).named_parameters():
        placed = _placements(name, tuple(parameter.shape), config)
        assert placed, name
        for placement, shape in placed:
            assert our_placements(placement.key, shape, True, False, PATTERN, gdn)[name] == placement, name
            written[placement.key] = shape
            taken.append((placement.key, placement.index, placement.row_offset))
    assert len(taken) == len(set(taken))
    assert {key: shape for key, shape in written.items() if _mixer_key(key)} == \
        {key: shape for key, (shape, _) in declared().items()}


def test_a_gated_deltanet_part_holds_each_heads_rows_in_head_order():
    """Our in_proj rows lie per query/key head [q_h|k_h|v_h|z_h|beta_h|alpha_h] (gpt/gated_delta_net.py); Megatron-
    Core's part `query` is every head's q rows in head order (gdn.py:40-48), and so on for each part."""
    from checkpoint.torch_dist.names import Placement, split_gdn_parts

    gdn = GdnHeads(KEY_HEADS, KEY_DIM, VALUE_HEADS, VALUE_DIM)
    group = VALUE_HEADS // KEY_HEADS
    runs = {"query": KEY_DIM, "key": KEY_DIM, "value": group * VALUE_DIM, "z": group * VALUE_DIM, "beta": group,
            "alpha": group}
    per_head = sum(runs.values())
    ours = torch.arange(KEY_HEADS * per_head).reshape(-1, 1).expand(-1, HIDDEN)  # each row holds its number
    whole = Placement("decoder.layers.5.self_attention.in_proj.weight", (), 0, tuple(ours.shape))
    offset = 0
    for (placement, shape), (part, run) in zip(split_gdn_parts(whole, tuple(ours.shape), gdn), runs.items()):
        assert placement.key == f"decoder.layers.5.self_attention.in_proj.weight.{part}"
        theirs = torch.empty(shape, dtype=ours.dtype)
        for region, within in placement.pieces((slice(0, ours.shape[0]), slice(0, HIDDEN))):
            theirs[region] = ours[within]
        expected = torch.cat([torch.arange(head * per_head + offset, head * per_head + offset + run)
                              for head in range(KEY_HEADS)])
        assert torch.equal(theirs[:, 0], expected), part
        offset += run
    # a region of ours starting inside a head's run: one contiguous region of theirs
    (region, within), = split_gdn_parts(whole, tuple(ours.shape), gdn)[0][0].pieces((slice(5, 60), slice(0, 2)))
    assert region == (slice(5, 16), slice(0, 2)) and within[0].tolist() == [0, 1, 2, *range(47, 55)]


def test_the_args_carry_the_mamba_and_linear_sizes():
    from checkpoint.torch_dist.args import megatron_args
    from parallel.state import ParallelState

    args = megatron_args(_config(), ParallelState(device=torch.device("cpu")), 2, 8)
    assert (args.mamba_head_dim, args.mamba_num_groups, args.mamba_state_dim, args.mamba_num_heads) == \
        (MAMBA_HEAD_DIM, GROUPS, STATE, None)
    assert (args.linear_num_key_heads, args.linear_num_value_heads, args.linear_key_head_dim,
            args.linear_value_head_dim, args.linear_conv_kernel_dim) == (KEY_HEADS, VALUE_HEADS, KEY_DIM, VALUE_DIM, 4)
    assert args.experimental_attention_variant is None and args.num_layers == len(PATTERN)  # a pattern's G layers
    gpt = megatron_args(_config(flags=_gpt_path("[1,0,1,1]")), ParallelState(device=torch.device("cpu")), 2, 8)
    assert gpt.experimental_attention_variant == "gated_delta_net" and gpt.linear_attention_freq == [1, 0, 1, 1]


def test_the_gpt_paths_gated_deltanet_layers_are_gptmodels_layers():
    """--experimental-attention-variant gated_delta_net: GPTModel's layers, each under its own key, as
    --linear-attention-freq (above 1, or a list; 1 makes none Gated DeltaNet) mixes them with attention
    (transformer_block.py:742-746); the GDN layer's input norm fused into in_proj
    (experimental_attention_variant_module_specs.py:72-76), the attention layer's into linear_qkv."""
    from checkpoint.torch_dist.writer import _placements
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    for freq, gdn_layers in (("2", (0, 2)), ("[1,1,0,1]", (0, 1, 3))):
        config = _config(flags=_gpt_path(freq))
        assert config.megatron_format_unwritten() is None
        gdn = GdnHeads.of(config.model.gdn)
        written = {}
        for name, parameter in GPTModel(config.model, ParallelState(device=torch.device("cpu"))).named_parameters():
            for placement, shape in _placements(name, tuple(parameter.shape), config):
                assert our_placements(placement.key, shape, True, False, None, gdn)[name] == placement, name
                written[placement.key] = shape
        for layer in range(4):
            norm = "in_proj" if layer in gdn_layers else "linear_qkv"
            assert written[f"decoder.layers.{layer}.self_attention.{norm}.layer_norm_weight"] == (HIDDEN,)
            assert (f"decoder.layers.{layer}.self_attention.in_proj.weight.beta" in written) == (layer in gdn_layers)
        assert {key: shape for key, shape in written.items() if key.startswith("decoder.layers.0.self_attention")} \
            == {key.replace(".5.", ".0."): shape for key, (shape, _) in declared().items()
                if key.startswith("decoder.layers.5.")}


# ---- the round trips ---------------------------------------------------------------------------------------------

def _train(save: Path, metrics: Path, *extra: str) -> None:
    """FLAGS trained 4 iterations, saved at 2 (and 4) in `save`, the save of 4 dropped (a resume reads 2)."""
    import pretrain_hybrid

    assert pretrain_hybrid.main([*FLAGS, "--save", str(save), "--save-interval", "2", "--metrics-file",
                                 str(metrics), *extra]) == 0


def _keep_iteration_2(*saves: Path) -> None:
    import shutil

    for save in saves:
        shutil.rmtree(save / "iter_0000004")
        (save / "latest_checkpointed_iteration.txt").write_text("2")


def _resume(save: Path, metrics: Path, *extra: str) -> None:
    import pretrain_hybrid

    assert pretrain_hybrid.main([*FLAGS, "--load", str(save), "--metrics-file", str(metrics), *extra]) == 0


def _losses(metrics: Path) -> dict[int, float]:
    from tests.reliability_helpers import metrics_records

    return {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}


FORMATS = {"torch_dist": "torch_dist", "ours": "torch"}  # the save's folder -> its --ckpt-format


def _train_at_tp2(rank: int, world_size: int, work: str, name: str) -> None:
    _train(Path(work) / name, Path(work) / f"{name}.jsonl", *TP2, "--ckpt-format", FORMATS[name])


def _resume_at_tp2(rank: int, world_size: int, work: str, name: str) -> None:
    _resume(Path(work) / name, Path(work) / f"{name}_at_tp2.jsonl", *TP2)


@pytest.fixture(scope="module")
def tp2_work(tmp_path_factory) -> Path:
    from tests.distributed import run_distributed

    work = tmp_path_factory.mktemp("tp2")
    for name in FORMATS:  # one launch a run: a process trains once
        run_distributed(_train_at_tp2, 2, str(work), name, timeout=600)
    _keep_iteration_2(work / "torch_dist", work / "ours")
    return work


def _chunks(iteration_dir: Path) -> dict[str, set]:
    from checkpoint.torch_dist.dcp_reader import DcpReader

    return {key: {(tuple(chunk.offsets), tuple(chunk.sizes)) for chunk in md.chunks}
            for key, md in DcpReader(iteration_dir).tensors().items() if _mixer_key(key)}


@pytest.mark.slow
def test_the_tp2_saves_chunks_are_the_per_rank_shards_megatron_core_declares(tp2_work):
    expected = {}
    for key, (shape, axis) in declared().items():
        ranks = 1 if axis is None else 2
        local = tuple(size // ranks if dim == axis else size for dim, size in enumerate(shape))
        expected[key] = {(tuple(rank * local[dim] if dim == axis else 0 for dim in range(len(shape))), local)
                         for rank in range(ranks)}
    folder = tp2_work / "torch_dist" / "iter_0000002"
    assert _chunks(folder) == expected
    # each TE linear's _extra_state, a ShardedObject of its own layer (transformer/utils.py:95-107, 193-217)
    from checkpoint.torch_dist.dcp_reader import DcpReader

    linears = {f"decoder.layers.{layer}.{module}.{linear}._extra_state/shard_0_1"
               for layers, module in ((MAMBA_LAYERS, "mixer"), (GDN_LAYERS, "self_attention"))
               for layer in layers for linear in ("in_proj", "out_proj")}
    assert linears == {key for key in DcpReader(folder).objects() if _mixer_key(key)}


@pytest.mark.slow
def test_a_tp2_save_resumes_at_tp1(tp2_work, tmp_path):
    for name in FORMATS:
        _resume(tp2_work / name, tmp_path / f"{name}.jsonl")
    straight, resumed = _losses(tp2_work / "torch_dist.jsonl"), _losses(tmp_path / "torch_dist.jsonl")
    assert sorted(resumed) == [3, 4]
    assert resumed == _losses(tmp_path / "ours.jsonl")  # bitwise: the same state, exactly
    assert resumed == pytest.approx({i: straight[i] for i in (3, 4)}, rel=1e-5, abs=0)  # TP 2's sums, TP 1's


@pytest.mark.slow
def test_a_tp1_save_resumes_at_tp2(tmp_path, monkeypatch):
    from tests.distributed import run_distributed

    monkeypatch.chdir(tmp_path)
    for name, ckpt_format in FORMATS.items():
        _train(tmp_path / name, tmp_path / f"{name}.jsonl", "--ckpt-format", ckpt_format)
    _keep_iteration_2(tmp_path / "torch_dist", tmp_path / "ours")
    for name in FORMATS:
        run_distributed(_resume_at_tp2, 2, str(tmp_path), name, timeout=600)
    straight, resumed = _losses(tmp_path / "torch_dist.jsonl"), _losses(tmp_path / "torch_dist_at_tp2.jsonl")
    assert sorted(resumed) == [3, 4]
    assert resumed == _losses(tmp_path / "ours_at_tp2.jsonl")
    assert resumed == pytest.approx({i: straight[i] for i in (3, 4)}, rel=1e-5, abs=0)
