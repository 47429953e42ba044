"""Document masking in training runs (--reset-position-ids, --reset-attention-mask, --eod-mask-loss): the logged loss
of a run's first iteration equals the plain model run on each document of each sample separately, with the
end-of-document token's prediction left out; evaluation masks the same way; tensor, pipeline and data parallelism
give the single process's losses.

Megatron-LM builds the masks per sample (megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids)
and reduces the loss per micro-batch: pretrain_gpt.py loss_func sums loss x mask and counts the mask's tokens,
megatron/core/pipeline_parallel/schedules.py forward_step_calc_loss divides by that count and by the number of
micro-batches, and the data-parallel gradient reduction averages over the ranks. It logs the masked sums over the
counts of all the micro-batches (megatron/training/training.py train_step; `evaluate` over all eval iterations). The data here are documents of
2 to 12 tokens, so every 32-token sample holds several.
"""

import itertools
import json

import numpy as np
import pytest
import torch

import pretrain_gpt
from arguments.config import ModelConfig
from data.documents import DocumentMasking
from data.indexed import IndexedDatasetWriter
from parallel.state import ParallelState
from tests.distributed import run_distributed
from training.evaluation import evaluate
from training.train_step import DataParallelTrainStep

EOD = 255  # NullTokenizer --vocab-size 255: ids 0..254, end-of-document 255
FLAGS = ["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"]
COMMON = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
          "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
          "--train-iters", "4", "--seed", "1", "--log-interval", "1", "--eval-iters", "0", "--device", "cpu",
          "--hidden-dropout", "0", "--attention-dropout", "0", "--tokenizer-type", "NullTokenizer",
          "--vocab-size", "255", "--split", "100,0,0"]


def short_documents(directory) -> str:
    prefix = str(directory / "short_documents")
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(400):
            writer.add_document(np.append(rng.integers(0, EOD, rng.integers(1, 12)), EOD))
        writer.finalize()
    return prefix


def argv(tmp_path, name, *extra) -> list[str]:
    return COMMON + ["--data-path", short_documents(tmp_path), "--data-cache-dir", str(tmp_path / "cache"),
                     "--metrics-file", str(tmp_path / f"{name}.jsonl"), *extra]


def records(tmp_path, name) -> list[dict]:
    return [json.loads(line) for line in open(tmp_path / f"{name}.jsonl") if '"grad_norm"' in line]


def per_document_sums(model, tokens: torch.Tensor) -> tuple[torch.Tensor, int]:
    """One micro-batch's loss sum and token count by hand: each sample cut after each EOD of its inputs, each piece
    through the plain model alone (positions from 0, attending only to itself), the losses of the EOD inputs left
    out."""
    total, count = torch.zeros(()), 0
    for row in tokens:
        inputs, labels = row[:-1], row[1:]
        ends = [int(i) + 1 for i in torch.nonzero(inputs == EOD).flatten()]
        for start, end in zip([0, *ends], [*ends, len(inputs)]):
            if end > start:
                losses = model(inputs[None, start:end], labels[None, start:end])[0]
                keep = inputs[start:end] != EOD
                total, count = total + losses[keep].sum(), count + int(keep.sum())
    return total, count


def sum_over_count(model, batches) -> torch.Tensor:
    """Megatron-LM's logged loss of `batches`: their masked loss sums over their token counts."""
    sums = [per_document_sums(model, batch["tokens"]) for batch in batches]
    return sum(total for total, _ in sums) / sum(count for _, count in sums)


def test_first_iteration_loss_is_each_document_alone_without_the_eods_prediction(tmp_path, monkeypatch):
    """The first iteration's loss is computed at the initial weights: the reference takes the same four
    micro-batches from the run's own loader and model before the run uses them."""
    reference = {}
    original = DataParallelTrainStep.forward_backward

    def reference_first(self, accumulation_steps, measure_activations):
        if not reference:
            batches = [next(self.train_batches) for _ in range(accumulation_steps)]
            self.train_batches = itertools.chain(batches, self.train_batches)
            with torch.no_grad():
                reference["loss"] = sum_over_count(self.model, batches)
        return original(self, accumulation_steps, measure_activations)

    monkeypatch.setattr(DataParallelTrainStep, "forward_backward", reference_first)
    assert pretrain_gpt.main(argv(tmp_path, "masked", *FLAGS)) == 0
    first = records(tmp_path, "masked")[0]["loss"]
    assert first == pytest.approx(reference["loss"].item(), rel=1e-5)
    reference.clear()
    monkeypatch.setattr(DataParallelTrainStep, "forward_backward", original)
    assert pretrain_gpt.main(argv(tmp_path, "plain")) == 0
    assert records(tmp_path, "plain")[0]["loss"] != pytest.approx(first, rel=1e-3)  # the flags changed it


def test_evaluation_uses_the_same_masks():
    """The validation loss is the masked loss sum over the token count of all its micro-batches, as Megatron-LM's
    training.py `evaluate` sums the (sum, count) pairs over its eval iterations and divides at the end."""
    config = ModelConfig.of(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=32,
                         max_position_embeddings=32, vocab_size=256, hidden_dropout=0.0, attention_dropout=0.0)
    from gpt.model import build_gpt_model
    state = ParallelState(device=torch.device("cpu"))
    model = build_gpt_model(config, state, seed=2)
    generator = torch.Generator().manual_seed(4)
    # 5%, 30% and 60% end-of-document tokens: three token counts
    batches = [{"tokens": torch.where(torch.rand(2, 33, generator=generator) < share, EOD,
                                      torch.randint(0, EOD, (2, 33), generator=generator))} for share in (.05, .3, .6)]
    documents = DocumentMasking.of(EOD, True, True, True)
    loss = evaluate(model, batches, 3, state, documents=documents)
    with torch.no_grad():
        expected = sum_over_count(model, batches)
        means = sum(total / count for total, count in (per_document_sums(model, b["tokens"]) for b in batches)) / 3
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    assert loss != pytest.approx(means.item(), rel=1e-4)  # the mean of the batches' masked means is another loss


def train_rank(rank, world_size, args):
    assert pretrain_gpt.main(args) == 0


def validation_losses(tmp_path, name) -> list[float]:
    return [json.loads(line)["loss"] for line in open(tmp_path / f"{name}.jsonl") if '"split": "valid"' in line]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [["--tensor-model-parallel-size", "2"],
                                      ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
                                      ["--pipeline-model-parallel-size", "2"],
                                      ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                                       "1"]], ids=["tp2", "tp2-sp", "pp2", "pp2-interleaved"])
def test_two_ranks_give_the_single_process_losses(tmp_path, parallel):
    """Training and validation losses (evaluation through the pipeline's forward too), with 4 layers so that
    interleaving gives each stage two model chunks, each of which reads the micro-batch's mask."""
    both = [*FLAGS, "--num-layers", "4", "--split", "90,10,0", "--eval-iters", "1", "--eval-interval", "2"]
    assert pretrain_gpt.main(argv(tmp_path, "single", *both)) == 0
    run_distributed(train_rank, 2, argv(tmp_path, "two", *both, *parallel), timeout=300)
    single, two = records(tmp_path, "single"), records(tmp_path, "two")
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in single], rel=1e-5)
    assert [r["grad_norm"] for r in two] == pytest.approx([r["grad_norm"] for r in single], rel=1e-4)
    assert len(validation_losses(tmp_path, "single")) == 2
    assert validation_losses(tmp_path, "two") == pytest.approx(validation_losses(tmp_path, "single"), rel=1e-5)


@pytest.mark.slow
def test_data_parallel_is_gradient_accumulation_over_the_same_micro_batches(tmp_path):
    """Megatron's reduction is per micro-batch (sum over its unmasked tokens / their count), then the mean over
    micro-batches and data-parallel ranks: DP 2 x 2 accumulation steps are the single process's 4 micro-batches."""
    assert pretrain_gpt.main(argv(tmp_path, "single", "--eod-mask-loss")) == 0
    run_distributed(train_rank, 2, argv(tmp_path, "dp2", "--eod-mask-loss"), timeout=300)
    single, dp2 = records(tmp_path, "single"), records(tmp_path, "dp2")
    assert [r["loss"] for r in dp2] == pytest.approx([r["loss"] for r in single], rel=1e-5)
    assert [r["grad_norm"] for r in dp2] == pytest.approx([r["grad_norm"] for r in single], rel=1e-4)


def train_context_parallel_grid(rank, world_size, runs, pipeline_parallel_size=1):
    """CP groups of `world_size` / `pipeline_parallel_size` ranks (DP 1) on each stage, several training runs in
    them, one after the other."""
    from arguments.parser import parse_config
    from parallel.state import destroy, initialize

    state = initialize("cpu", context_parallel_size=world_size // pipeline_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size)
    try:
        for args in runs:
            pretrain_gpt.run(parse_config(args), state)
    finally:
        destroy(state)


GOLDFISH = ["--eod-mask-loss", "--goldfish-loss", "--goldfish-k", "3", "--goldfish-h", "2"]
CP_RUNS = {  # name: (the masking flags, --cp-comm-type)
    "eod-p2p": (["--eod-mask-loss"], "p2p"),
    "all-p2p": (FLAGS, "p2p"), "all-all_gather": (FLAGS, "all_gather"), "all-a2a": (FLAGS, "a2a"),
    "goldfish-p2p": (GOLDFISH, "p2p"),
}


@pytest.mark.slow
def test_context_parallel_gives_the_single_process_losses(tmp_path):
    """fp32 on gloo, CP 2 (one launch of 2 ranks running each configuration in turn): the masks are the whole
    sample's, split with the tokens (data/documents_cp.py, as Megatron-LM's get_batch_on_this_cp_rank splits
    loss_mask and position_ids beside tokens and labels), and each micro-batch's loss is the masked sum over the
    ranks' counts (training/evaluation.py micro_batch_loss), so the training and validation losses and the gradient
    norms are the single process's. Documents of 2 to 12 tokens in 32-token samples cut in 8-token chunks: the
    ranks hold different numbers of EODs (masked tokens), documents run across chunks and ranks, and the goldfish
    loss's 2-label windows cross the chunks' edges. Not bitwise: the CP attention merges partial softmaxes (p2p)
    or softmaxes a masked row of the gathered keys, and the loss sums in another order; relative 1e-6 is the bound
    of tests/training/test_context_parallel_training.py."""
    both = ["--num-layers", "2", "--split", "90,10,0", "--eval-iters", "1", "--eval-interval", "2"]
    references = {"eod": ["--eod-mask-loss"], "all": FLAGS, "goldfish": GOLDFISH}
    for name, flags in references.items():
        assert pretrain_gpt.main(argv(tmp_path, f"single-{name}", *flags, *both)) == 0
    runs = [argv(tmp_path, f"cp2-{name}", *flags, *both, "--context-parallel-size", "2", "--cp-comm-type", comm)
            for name, (flags, comm) in CP_RUNS.items()]
    run_distributed(train_context_parallel_grid, 2, runs, timeout=600)
    # CP 2 x PP 2: each micro-batch's masks and positions travel with it through the stages (the last one's loss
    # mask, every stage's attention mask); measured 1e-7 relative to the single process, p2p and a2a alike
    run_distributed(train_context_parallel_grid, 4, [argv(tmp_path, "cp2-pp2-all-p2p", *FLAGS, *both,
                                                          "--context-parallel-size", "2", "--cp-comm-type", "p2p",
                                                          "--pipeline-model-parallel-size", "2")], 2, timeout=600)
    for name in [*CP_RUNS, "pp2-all-p2p"]:
        single, cp2 = records(tmp_path, f"single-{name.split('-')[-2]}"), records(tmp_path, f"cp2-{name}")
        assert len(cp2) == len(single) == 4, name
        assert [r["loss"] for r in cp2] == pytest.approx([r["loss"] for r in single], rel=1e-6), name
        assert [r["grad_norm"] for r in cp2] == pytest.approx([r["grad_norm"] for r in single], rel=1e-6), name
        assert validation_losses(tmp_path, f"cp2-{name}") == pytest.approx(
            validation_losses(tmp_path, f"single-{name.split('-')[-2]}"), rel=1e-6), name
    # the masks changed the losses: the plain run's first loss is another
    assert pretrain_gpt.main(argv(tmp_path, "plain", *both)) == 0
    assert records(tmp_path, "plain")[0]["loss"] != pytest.approx(records(tmp_path, "single-eod")[0]["loss"], rel=1e-4)


def test_activation_checkpointing_recomputes_with_the_same_masks(tmp_path):
    """The recompute in backward runs each block group with the micro-batch's masks again
    (zero/activations.py _BlockGroup holds them): the gradients, hence the losses after the first update, are
    the run's without checkpointing."""
    assert pretrain_gpt.main(argv(tmp_path, "plain", *FLAGS)) == 0
    assert pretrain_gpt.main(argv(tmp_path, "recomputed", *FLAGS, "--checkpoint-activations")) == 0
    plain, recomputed = records(tmp_path, "plain"), records(tmp_path, "recomputed")
    assert [r["loss"] for r in recomputed] == pytest.approx([r["loss"] for r in plain], rel=1e-6)
    assert [r["grad_norm"] for r in recomputed] == pytest.approx([r["grad_norm"] for r in plain], rel=1e-6)


def test_reset_position_ids_under_rotary_positions_is_said_to_change_nothing():
    """Megatron-Core's GPTModel._preprocess computes rope's angles for positions 0..seq-1 whatever position_ids say
    (they reach only the learned embedding): the flag has no effect there, said once at the start."""
    from arguments.parser import parse_config
    from training.run_settings import resolve_run_settings

    def notes(*flags):
        return [note for note in resolve_run_settings(parse_config(list(flags)), 128, 1, 1, "cpu").notes
                if "--reset-position-ids" in note]

    assert notes("--reset-position-ids") == []
    assert notes("--position-embedding-type", "rope") == []
    (line,) = notes("--reset-position-ids", "--position-embedding-type", "rope")
    assert "has no effect with --position-embedding-type rope" in line and "Megatron-LM" in line
