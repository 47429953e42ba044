"""DeepSpeed's checkpoints continued here (issue 62, item 3): tests/fixtures/deepspeed_checkpoints, written by
DeepSpeed 0.19.8's own engine (scripts/tools/deepspeed_checkpoint_fixtures.py, which also recorded DeepSpeed's next loss
from each checkpoint in losses.json), read without DeepSpeed installed.

- The fused query/key/value rows: Megatron-DeepSpeed's split after commit 676a482c (three blocks per TP rank,
  megatron/model/transformer.py ParallelAttention.forward, copied below as the reference) gives each head the rows
  our grouped split (gpt/qkv_projection.py QKVLayout.split) gives it after the reorder; transformers' [q | k | v]
  reorder equals checkpoint/hf/folders.py's own.
- Every layout reads the same tensors: ZeRO 1 and 2 of one run bitwise, ZeRO 3 and its universal form (DeepSpeed's
  own consolidation, ds_to_universal) bitwise, ZeRO 3 against ZeRO 1 to DeepSpeed's rounding (1e-6 relative), the
  GPT-2 run's ZeRO 2 and universal forms bitwise, GPTModelPipe's ZeRO 1 and universal forms as GPTModel's ZeRO 1
  bitwise (the same run as a pipeline module); any region reads as the whole tensor's slice, counting its bytes.
- The continuation (slow): pretrain_gpt.py with the run's flags and --load trains iteration 3, and its loss equals
  the one DeepSpeed computed from the same checkpoint (1e-5 relative; fp32).
- A corrupted, truncated, linked-out or code-carrying file, a pointer out of the folder, a missing rank's file:
  refused in one line naming the file, exit 2, before any data or model work; and --save into DeepSpeed's folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import pretrain_gpt
from arguments.parser import parse_config
from base.options import replace_settings
from checkpoint.deepspeed.files import find_deepspeed_checkpoint
from checkpoint.deepspeed.names import Attention, qkv_rows_from_blocks
from checkpoint.deepspeed.source import DeepSpeedSource, open_deepspeed_source
from tests.reliability_helpers import metrics_records, run_main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deepspeed_checkpoints"
RECORD = json.loads((FIXTURES / "losses.json").read_text())


def case_model(case: str, *extra: str):
    """The model of the run that continues `case`, as the loader sees it: the case's flags (`extra` after them), the
    vocabulary resolved (NullTokenizer's ids and its end of document)."""
    model = parse_config(RECORD["cases"][case]["our_flags"] + ["--mock-data", *extra]).model
    return replace_settings(model, vocab_size=model.vocab_size + 1)


def source(case: str, universal: bool = False, folder: Path = FIXTURES) -> DeepSpeedSource:
    return open_deepspeed_source(find_deepspeed_checkpoint(folder / case, universal), case_model(case))


def whole(src: DeepSpeedSource) -> dict[str, dict[str, torch.Tensor]]:
    return {key: {name: src.read(key, name, tuple(slice(0, d) for d in info.shape))
                  for name, info in src.tensors(key).items()} for key in src.keys()}


# ---- the fused query/key/value rows ---------------------------------------------------------------------------------

def megatron_deepspeed_split(mixed: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, ...]:
    """microsoft/Megatron-DeepSpeed megatron/model/transformer.py ParallelAttention.forward (after 676a482c), one TP
    rank's [s, b, 3 x its heads x d] -> q, k, v as [s, b, heads, d]."""
    seq_len, bs = mixed.shape[0], mixed.shape[1]
    each_hidden_size = mixed.shape[-1] // 3
    query_layer = mixed[:, :, :each_hidden_size].reshape(seq_len, bs, -1, head_dim)
    key_layer = mixed[:, :, each_hidden_size:each_hidden_size + each_hidden_size].reshape(seq_len, bs, -1, head_dim)
    value_layer = mixed[:, :, each_hidden_size + each_hidden_size:].reshape(seq_len, bs, -1, head_dim)
    return query_layer, key_layer, value_layer


def our_split(mixed: torch.Tensor, heads: int, groups: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """gpt/model.py's grouped layout: [group][its queries, key, value][d] -> q, k, v as [s, b, heads (groups), d]."""
    per_group = heads // groups
    view = mixed.view(*mixed.shape[:2], groups, per_group + 2, head_dim)
    query = view[:, :, :, :per_group].reshape(*mixed.shape[:2], heads, head_dim)
    return query, view[:, :, :, per_group], view[:, :, :, per_group + 1]


@pytest.mark.parametrize("heads, tensor_parallel", [(2, 1), (4, 1), (4, 2), (8, 4)])
def test_megatron_deepspeeds_query_key_value_blocks_give_each_head_the_rows_our_split_does(heads, tensor_parallel):
    head_dim = 3
    rows = heads * 3 * head_dim
    theirs = torch.randn(5, 2, rows)  # [s, b, rows]: the projection's output over the whole (merged) rows
    ours = theirs[:, :, qkv_rows_from_blocks(heads, heads, head_dim, tensor_parallel)]
    q, k, v = our_split(ours, heads, heads, head_dim)
    per_rank = rows // tensor_parallel
    for rank in range(tensor_parallel):  # each TP rank split its own slice of the rows (ds_to_universal's merge)
        local = slice(rank * heads // tensor_parallel, (rank + 1) * heads // tensor_parallel)
        for mine, reference in zip((q, k, v), megatron_deepspeed_split(theirs[:, :, rank * per_rank:(rank + 1) *
                                                                             per_rank], head_dim)):
            assert torch.equal(mine[:, :, local], reference)


def test_transformers_qkv_reorder_is_the_hugging_face_exports_own():
    from checkpoint.hf.folders import _qkv_hf_to_ours

    rows = torch.arange(4 * 3 * 5)
    assert torch.equal(rows[qkv_rows_from_blocks(4, 4, 5)], _qkv_hf_to_ours(rows, 4))


def test_a_block_layout_with_fewer_key_value_heads_is_refused_as_megatron_deepspeed_cannot_split_it():
    from base.errors import CheckpointError
    from checkpoint.deepspeed.names import megatron_deepspeed_map

    shapes = {"language_model.encoder.layers.0.self_attention.query_key_value.weight": (32, 16)}
    with pytest.raises(CheckpointError, match="three equal blocks, which holds only for multi-head attention"):
        megatron_deepspeed_map(shapes, Attention(heads=4, groups=2, head_dim=4), block_qkv=True, tensor_parallel=1,
                               swiglu=False)
    mapped, _ = megatron_deepspeed_map(shapes, Attention(heads=4, groups=2, head_dim=4), block_qkv=False,
                                       tensor_parallel=1, swiglu=False)
    assert mapped["blocks.0.attention.query_key_value.weight"].rows is None  # before #441: our own layout


def test_a_pipeline_modules_names_are_gpt_models():
    """GPTModelPipe's specs (megatron/model/gpt_model.py): a cast, the embedding, the layers, the final norm, the
    output layer; parameters named by their spec's index, the tied embedding under tied_modules.embed."""
    from checkpoint.deepspeed.names import pipeline_module_names

    layer = ["input_layernorm.weight", "self_attention.query_key_value.weight", "mlp.dense_4h_to_h.bias"]
    tied = ["tied_modules.embed.word_embeddings.weight", "tied_modules.embed.position_embeddings.weight",
            *[f"{index}.{name}" for index in (2, 3) for name in layer], "4.weight", "4.bias"]
    assert pipeline_module_names(tied) == {
        "tied_modules.embed.word_embeddings.weight": "language_model.embedding.word_embeddings.weight",
        "tied_modules.embed.position_embeddings.weight": "language_model.embedding.position_embeddings.weight",
        **{f"{index}.{name}": f"language_model.encoder.layers.{index - 2}.{name}" for index in (2, 3) for name in layer},
        "4.weight": "language_model.encoder.final_layernorm.weight",
        "4.bias": "language_model.encoder.final_layernorm.bias"}
    untied = ["1.word_embeddings.weight", *[f"2.{name}" for name in layer], "3.weight", "4.lm_head.weight"]
    assert pipeline_module_names(untied) == {
        "1.word_embeddings.weight": "language_model.embedding.word_embeddings.weight",
        **{f"2.{name}": f"language_model.encoder.layers.0.{name}" for name in layer},
        "3.weight": "language_model.encoder.final_layernorm.weight",
        "4.lm_head.weight": "language_model.output_layer.weight"}


# ---- every layout reads the same tensors ----------------------------------------------------------------------------

def test_zero_1_2_3_and_universal_files_hold_the_same_run():
    zero1, zero2 = whole(source("megatron_deepspeed_zero1")), whole(source("megatron_deepspeed_zero2"))
    zero3, universal3 = whole(source("megatron_deepspeed_zero3")), whole(source("megatron_deepspeed_zero3", True))
    for key in ("master", "exp_avg", "exp_avg_sq"):
        assert zero1[key].keys() == zero3[key].keys() and len(zero1[key]) == 28
        for name, tensor in zero1[key].items():
            assert torch.equal(tensor, zero2[key][name]), (key, name)
            assert torch.equal(zero3[key][name], universal3[key][name]), (key, name)
            assert torch.allclose(tensor, zero3[key][name], rtol=0, atol=1e-6 * tensor.abs().max().item()), (key, name)
    gpt2, gpt2_universal = whole(source("hf_gpt2_zero2")), whole(source("hf_gpt2_zero2", True))
    for key in gpt2:
        for name, tensor in gpt2[key].items():
            assert torch.equal(tensor, gpt2_universal[key][name]), (key, name)
    assert "output_layer.weight" not in gpt2["master"]  # lm_head is the tied word embedding
    # GPTModelPipe (its layers' weights in layer_NN-model_states.pt) trained the same steps as GPTModel at ZeRO 1
    pipe, pipe_universal = whole(source("megatron_deepspeed_pipe_zero1")), \
        whole(source("megatron_deepspeed_pipe_zero1", True))
    for key in zero1:
        assert pipe[key].keys() == zero1[key].keys()
        for name, tensor in zero1[key].items():
            assert torch.equal(pipe[key][name], tensor) and torch.equal(pipe_universal[key][name], tensor), (key, name)


@pytest.mark.parametrize("case, universal", [("megatron_deepspeed_zero2", False), ("megatron_deepspeed_zero3", False),
                                             ("hf_gpt2_zero2", False), ("hf_gpt2_zero2", True)])
def test_any_region_reads_as_the_whole_tensors_slice_and_only_its_bytes(case, universal):
    src = source(case, universal)
    full = whole(src)
    for key in src.keys():
        for name, tensor in full[key].items():
            region = tuple(slice(size // 4, size - size // 4) if size > 1 else slice(0, 1) for size in tensor.shape)
            before = src.store.bytes_read
            read = src.read(key, name, region)
            # a plain copy: DeepSpeed saved its partitions with requires_grad set
            assert torch.equal(read, tensor[region]) and not read.requires_grad, (key, name)
            assert src.store.bytes_read - before == tensor[region].numel() * 4, (key, name)


@pytest.mark.parametrize("case, universal", [("megatron_deepspeed_zero1", False), ("megatron_deepspeed_zero3", True),
                                             ("megatron_deepspeed_pipe_zero1", False), ("hf_gpt2_zero2", False)])
def test_where_the_run_stood(case, universal):
    progress = source(case, universal).progress()
    # iteration 2 of global batch 4; Megatron-DeepSpeed's scheduler at 8 samples; Adam's step 2; fp32's static scale
    assert (progress.iteration, progress.consumed_samples, progress.schedule_samples, progress.optimizer_step) == \
        (2, 8, 8, 2)
    assert (progress.loss_scaler_state, progress.extra["loss_scaler_type"]) == ({"scale": 1.0}, "LossScaler")


# ---- the continuation ------------------------------------------------------------------------------------------------

def continue_run(case: str, tmp_path: Path, *extra) -> tuple[int, str, list[dict]]:
    """pretrain_gpt.main with the case's flags on a copy of the fixture (the data's index caches go beside it)."""
    copy = tmp_path / "fixture"
    shutil.copytree(FIXTURES, copy, symlinks=True)
    argv = RECORD["cases"][case]["our_flags"] + ["--data-path", copy / "data" / "tokens", "--data-cache-dir",
                                                 tmp_path / "cache", "--load", copy / case,
                                                 "--metrics-file", tmp_path / "m.jsonl", *extra]
    outcome = run_main(pretrain_gpt.main, argv)
    records = metrics_records(tmp_path / "m.jsonl") if (tmp_path / "m.jsonl").exists() else []
    return outcome.code, outcome.out + outcome.err, [r for r in records if "loss" in r]


def continues_to_deepspeeds_loss(case: str, universal: bool, tmp_path: Path, rel: float) -> tuple[str, list[dict]]:
    """The case continued from its iteration 2 (its universal form with `universal`): iteration 3 alone, at 12
    samples, its loss DeepSpeed's own from the same checkpoint within `rel` relative; (the output, the records)."""
    theirs = RECORD["cases"][case]["deepspeed_resumed_from_universal" if universal else "deepspeed_resumed"]["3"]
    code, out, records = continue_run(case, tmp_path, *(["--universal-checkpoint"] if universal else []))
    assert code == 0, out[-3000:]
    assert [r["iteration"] for r in records] == [3] and records[0]["consumed_samples"] == 12
    assert records[0]["loss"] == pytest.approx(theirs, rel=rel, abs=0)
    assert "Adam step 2" in out and "resuming after iteration 2 (8 samples consumed)" in out
    return out, records


@pytest.mark.slow
@pytest.mark.parametrize("case, universal", [("megatron_deepspeed_zero1", False), ("megatron_deepspeed_zero2", False),
                                             ("megatron_deepspeed_zero3", False), ("megatron_deepspeed_zero3", True),
                                             ("megatron_deepspeed_pipe_zero1", False),
                                             ("megatron_deepspeed_pipe_zero1", True),
                                             ("hf_gpt2_zero2", False), ("hf_gpt2_zero2", True)])
def test_our_next_iteration_computes_the_loss_deepspeed_computed_from_the_same_checkpoint(case, universal, tmp_path):
    out, records = continues_to_deepspeeds_loss(case, universal, tmp_path, rel=1e-5)
    if case.startswith("megatron"):  # its scheduler's position: iteration 3 at 8 of 12 samples of linear decay
        assert records[0]["lr"] == pytest.approx(1e-4 + (1 - 8 / 12) * (1e-3 - 1e-4), rel=1e-12)
    else:
        assert "plain DeepSpeed run's" in out


@pytest.mark.slow
def test_adam_settings_other_than_the_checkpoints_are_named_in_one_line(tmp_path):
    """DeepSpeed's own resume keeps the saved param_groups' betas and weight decay; ours takes its flags and says so."""
    code, out, _ = continue_run("megatron_deepspeed_zero2", tmp_path, "--adam-beta2", "0.95", "--weight-decay", "0.1")
    assert code == 0, out[-3000:]
    notes = [line for line in out.splitlines() if "DeepSpeed's own resume would keep them" in line]
    assert len(notes) == 1 and "betas (0.9, 0.999) (this run's: (0.9, 0.95))" in notes[0], out[-3000:]
    assert "weight_decay 0.01 (this run's --weight-decay: 0.1)" in notes[0]


def continue_at_layouts(rank: int, world_size: int, case: str, workdir: str, layouts: dict, ports: list[int]) -> dict:
    """The case continued at each layout ({name: (flags, TP size)}) on this rank: {name: its iteration-3 loss}."""
    import pretrain_gpt as entry
    from arguments.parser import parse_config
    from parallel.state import destroy, initialize

    losses = {}
    for (name, (flags, tensor_parallel)), port in zip(layouts.items(), ports):
        os.environ["MASTER_PORT"] = str(port)
        run_dir = Path(workdir) / name
        argv = RECORD["cases"][case]["our_flags"] + [
            "--data-path", Path(workdir) / "fixture" / "data" / "tokens", "--data-cache-dir", run_dir / f"cache{rank}",
            "--load", Path(workdir) / "fixture" / case, "--metrics-file", run_dir / "m.jsonl", *flags]
        state = initialize("cpu", tensor_parallel)
        try:
            entry.run(parse_config([str(a) for a in argv]), state)
        finally:
            destroy(state)
        losses[name] = [r["loss"] for r in metrics_records(run_dir / "m.jsonl") if "loss" in r] if rank == 0 else None
    return losses


@pytest.mark.slow
def test_a_deepspeed_checkpoint_continues_at_another_layout_here(tmp_path):
    """Megatron-DeepSpeed's ZeRO 2 files (DP 2) at our TP 2 (each rank reads its rows of the reordered query/key/value
    and its columns of the dense weights) and at DP 2 under ZeRO 3: DeepSpeed's loss, to 1e-5 (TP's sums run in
    another order)."""
    from tests.distributed import free_port, run_distributed

    shutil.copytree(FIXTURES, tmp_path / "fixture")
    layouts = {"tp2": (["--tensor-model-parallel-size", "2"], 2), "dp2-zero3": (["--zero-stage", "3"], 1)}
    results = run_distributed(continue_at_layouts, 2, "megatron_deepspeed_zero2", str(tmp_path), layouts,
                              [free_port() for _ in layouts], timeout=600)
    theirs = RECORD["cases"]["megatron_deepspeed_zero2"]["deepspeed_resumed"]["3"]
    for name, losses in results[0].items():
        assert losses == [pytest.approx(theirs, rel=1e-5, abs=0)], name


# ---- refusals --------------------------------------------------------------------------------------------------------

def flip_a_tensor_byte(path: Path) -> None:
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        record = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size > 8)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[record.header_offset + 26:record.header_offset + 30])
    data[record.header_offset + 30 + name_length + extra_length + 5] ^= 0x10
    path.write_bytes(bytes(data))


def carry_code(path: Path) -> None:
    """Replace `path` with a torch file whose pickle would run a shell command when unpickled unsafely."""
    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {path.parent / 'ran'}",)
    torch.save({"module": Payload()}, path)


def link_out(path: Path) -> None:
    outside = path.parents[3] / "outside.pt"
    shutil.copy(path, outside)
    path.unlink()
    path.symlink_to(outside)


DAMAGES = {
    "a flipped byte": ("global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", flip_a_tensor_byte,
                       "does not match the CRC-32 saved with it"),
    "a truncated file": ("global_step2/mp_rank_00_model_states.pt",
                         lambda p: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2]), "truncated or corrupt"),
    "a file linked outside": ("global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt", link_out,
                              "points outside the checkpoint directory"),
    "code in a pickle": ("global_step2/mp_rank_00_model_states.pt", carry_code, "refused, not a DeepSpeed checkpoint "
                                                                                "file this reader can load"),
    "a missing rank's file": ("global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", Path.unlink,
                              "partition_count [2, 2] for 1 optimizer files"),
    "latest pointing out": ("latest", lambda p: p.write_text("../../elsewhere"), "not an iteration directory name"),
    "latest naming no folder": ("latest", lambda p: p.write_text("global_step9"), "which holds no DeepSpeed model"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_deepspeed_checkpoint_is_refused_in_one_line_before_any_work(damage, tmp_path):
    member, damage_it, says = DAMAGES[damage]
    copy = tmp_path / "fixture"
    shutil.copytree(FIXTURES / "megatron_deepspeed_zero2", copy / "megatron_deepspeed_zero2")
    shutil.copytree(FIXTURES / "data", copy / "data")
    damage_it(copy / "megatron_deepspeed_zero2" / member)
    argv = RECORD["cases"]["megatron_deepspeed_zero2"]["our_flags"] + [
        "--data-path", copy / "data" / "tokens", "--data-cache-dir", tmp_path / "cache",
        "--load", copy / "megatron_deepspeed_zero2", "--metrics-file", tmp_path / "m.jsonl"]
    outcome = run_main(pretrain_gpt.main, argv)
    assert outcome.code == 2, outcome.out[-2000:] + outcome.err[-2000:]
    error = [line for line in outcome.err.splitlines() if "error:" in line]
    assert len(error) == 1 and says in error[0], outcome.err[-2000:]
    assert "preparing tokenizer and data" not in outcome.out  # refused before any data or model work
    assert not (copy / "megatron_deepspeed_zero2" / "global_step2" / "ran").exists()  # the pickle's code never ran


def test_save_into_deepspeeds_folder_and_a_universal_only_folder_are_refused(tmp_path):
    copy = tmp_path / "fixture"
    shutil.copytree(FIXTURES / "megatron_deepspeed_zero3", copy / "zero3")
    shutil.copytree(FIXTURES / "data", copy / "data")
    common = RECORD["cases"]["megatron_deepspeed_zero3"]["our_flags"] + [
        "--data-path", copy / "data" / "tokens", "--data-cache-dir", tmp_path / "cache",
        "--metrics-file", tmp_path / "m.jsonl"]
    saved = run_main(pretrain_gpt.main, common + ["--load", copy / "zero3", "--save", copy / "zero3"])
    assert saved.code == 2 and "holds DeepSpeed's checkpoints ('latest' names its global_step2)" in saved.err
    assert (copy / "zero3" / "latest").read_text() == "global_step2"  # untouched
    (copy / "zero3" / "latest").unlink()
    universal_only = run_main(pretrain_gpt.main, common + ["--load", copy / "zero3"])
    assert universal_only.code == 2 and "pass --universal-checkpoint to load it" in universal_only.err


# ---- the fp16 loss scaler ---------------------------------------------------------------------------------------------

class DeepSpeedDynamicScaler:
    """deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale (0.19.8), consecutive_hysteresis off:
    the reference the mapped state must follow."""

    def __init__(self, scale, window, hysteresis):
        self.cur_scale, self.cur_iter, self.last_overflow_iter = scale, 0, -1
        self.scale_factor, self.scale_window, self.min_scale = 2.0, window, 1.0
        self.delayed_shift = self.cur_hysteresis = hysteresis

    def update_scale(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1


@pytest.mark.parametrize("seed", range(6))
def test_deepspeeds_dynamic_loss_scaler_continues_as_its_own_would(seed):
    """After any history, the mapped state grows at DeepSpeed's next growth and every one after it while no step
    overflows, and backs off at the same overflows (the hysteresis) while every step does."""
    import random

    from checkpoint.deepspeed.files import DynamicLossScaler
    from checkpoint.deepspeed.source import our_loss_scaler
    from zero.loss_scaler import DynamicLossScaler as Ours

    generator = random.Random(seed)
    for then in ([False] * 3 * 4, [True] * 5):
        theirs = DeepSpeedDynamicScaler(2.0 ** 16, window=4, hysteresis=2)
        for _ in range(generator.randrange(0, 15)):
            theirs.update_scale(generator.random() < 0.2)
        saved = DynamicLossScaler()
        saved.__dict__.update(vars(theirs))
        kind, state = our_loss_scaler(saved)
        ours = Ours(growth_interval=4, hysteresis=2)
        ours.load_state_dict(state)
        assert kind == "DynamicLossScaler" and ours.scale == theirs.cur_scale
        for overflow in then:
            theirs.update_scale(overflow)
            ours.update(overflow)
            assert ours.scale == theirs.cur_scale, (seed, then)
