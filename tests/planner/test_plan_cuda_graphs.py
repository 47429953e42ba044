"""The planner under --cuda-graph-impl (training/cuda_graphs.py): a GPU plan counts the graphs' static buffers (each
captured region's input and incoming-gradient buffers, one micro-batch's hidden states each, and the gradient arena, the
largest region's parameters) and keeps their pool (the activations saved at the forward's peak and the block gradients
in flight) reserved through the optimizer step; iteration 1 (eager under local) is planned as before. A CPU plan
captures nothing and counts nothing."""

from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run

HIDDEN, LAYERS, SEQ, MICRO = 64, 2, 32, 2
FLAGS = ["--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", "4", "--seq-length",
         str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size", str(MICRO), "--global-batch-size", "4"]
GPU = Cluster(1, 1, 80 * 2**30, device_type="cuda")


def test_a_gpu_plan_counts_the_graphs_buffers_and_holds_their_pool_through_the_step():
    eager = dry_run(parse_config(FLAGS), GPU, 512)
    graphed = dry_run(parse_config(FLAGS + ["--cuda-graph-impl", "local"]), GPU, 512)
    hidden_bytes = MICRO * SEQ * HIDDEN * 4  # fp32
    block_parameters = 12 * HIDDEN**2 + 13 * HIDDEN  # GPT-2's block: QKV, projection, MLP and two LayerNorms
    assert graphed.cuda_graph_static_bytes == 2 * LAYERS * hidden_bytes + block_parameters * 4
    assert graphed.cuda_graph_pool_bytes == \
        graphed.saved_activation_bytes["device"] + graphed.gradient_working_bytes - graphed.logits_bytes
    assert graphed.total_bytes >= eager.total_bytes + graphed.cuda_graph_static_bytes
    assert graphed.total_bytes >= graphed.model_state_bytes["total"] + graphed.buffer_bytes \
        + graphed.cuda_graph_static_bytes + graphed.step_working_bytes + graphed.cuda_graph_pool_bytes
    assert graphed.first_iteration_bytes == eager.first_iteration_bytes  # the first iteration is eager
    halves = dry_run(parse_config(FLAGS + ["--cuda-graph-impl", "local", "--cuda-graph-modules", "attn"]), GPU, 512)
    attention_parameters = 4 * HIDDEN**2 + 6 * HIDDEN  # QKV and projection, and the input LayerNorm
    assert halves.cuda_graph_static_bytes == 2 * LAYERS * hidden_bytes + attention_parameters * 4
    cpu = dry_run(parse_config(FLAGS + ["--cuda-graph-impl", "local"]), Cluster(1, 1, device_type="cpu"), 512)
    assert cpu.cuda_graph_static_bytes == cpu.cuda_graph_pool_bytes == 0
