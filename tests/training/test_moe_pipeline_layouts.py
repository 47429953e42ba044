"""Expert parallelism over any pipeline split (issue 77 item 1): pipeline stages and virtual chunks that hold no MoE
layer train as one rank does, through pretrain_gpt.py (fp32, dropout off, 4 gloo ranks, 3 iterations of 4 micro-batches
against one rank with the same global batch).

- Interleaved, dense first layer (`--moe-layer-freq [0,1,1,1]`, PP 2 x DP 2 x EP 2, one layer a virtual stage): stage
  0's first chunk has no MoE layer, and its backward slots gave the experts' reducer nothing. Before, the
  finish_grad_sync() after such a slot reduced the experts' accumulation half-way at ZeRO 0 and 1 (zero/grad_reducer.py
  no_sync): grad norms 2-9% low from iteration 1, expert gradients halved.
- A dense second stage (`[1,1,0,0]`, PP 2 x DP 2 x EP 2, ZeRO 1) and a dense first stage under tensor parallelism
  (`[0,0,1,1]`, TP 2 with sequence parallelism x PP 2, expert TP 1): a stage without experts has no experts' ZeRO, as
  Megatron-Core builds its expert optimizer only where there are expert parameters; its norm joins the others in one
  sum over the stages (zero/experts.py). Before, every rank died in the build ("the model has no expert parameter").

Equal, not bitwise: DP 2 sums the micro-batches' gradients in another order than one rank, and the norm is summed
from the stages' and the parts' squares. Measured: losses within 1.7e-7, grad norms within 2.5e-7 (relative).
"""

from __future__ import annotations

import json

import pytest

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, run_main
from tests.training.test_moe_training import launch_rank

MOE = ["--num-layers", "4", "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
       "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-token-dispatcher-type",
       "alltoall", "--seed", "5", "--train-iters", "3", "--global-batch-size", "8"]
EP2 = ["--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2"]
LAYOUTS = {  # name: (--moe-layer-freq, the layout's flags on 4 ranks)
    "interleaved-dense-first-layer-zero0": (
        "[0,1,1,1]", EP2 + ["--num-layers-per-virtual-pipeline-stage", "1", "--zero-stage", "0"]),
    "dense-second-stage-zero1": ("[1,1,0,0]", EP2 + ["--zero-stage", "1"]),
    "dense-first-stage-tp2-expert-tp1": (
        "[0,0,1,1]", ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
                      "--expert-tensor-parallel-size", "1", "--zero-stage", "1"]),
}


def logged(path):
    return [value for record in map(json.loads, path.read_text().splitlines()) if "loss" in record
            for value in (record["loss"], record["grad_norm"], record["load_balancing_loss"], record["z_loss"])]


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_stages_and_chunks_without_moe_layers_train_as_one_rank(corpus_cache_300, tmp_path, name):
    import pretrain_gpt

    frequency, flags = LAYOUTS[name]
    common = TINY + MOE + ["--moe-layer-freq", frequency, "--data-cache-dir", corpus_cache_300]
    one_rank = run_main(pretrain_gpt.main, common + ["--metrics-file", tmp_path / "one.jsonl"])
    assert one_rank.code == 0, one_rank.err[-2000:]
    run_distributed(launch_rank, 4, [common + flags + ["--metrics-file", str(tmp_path / "four.jsonl")]],
                    [free_port()], timeout=600)
    expected = logged(tmp_path / "one.jsonl")
    assert len(expected) == 3 * 4
    assert logged(tmp_path / "four.jsonl") == pytest.approx(expected, rel=1e-6, abs=0)
