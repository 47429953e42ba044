"""Issue 94's question ("will Llama 3 70B fit on 64 H100s at sequence 8192, and how should I lay it out?") at a scale
that runs in seconds: Llama 3 70B's widths at 4 layers on 8 H100s. Every pick `python -m zero.plan search` prints
fits by `zero.plan dry-run` given the printed command's flags as printed; the count it ranked them by ran under
that dry run; it says on stderr what it is doing while it works (planner/search_progress.py), at most a line every
couple of seconds while it counts; and the answer names the global batch, sequence and precision it is for (a
batch the user did not give is on every command), and, without the dry-run check, that its picks are unchecked."""

import json
import re
import shlex

from planner.perf_model import load_hardware
from planner.plan import main
from planner.search_progress import SearchProgress

H100 = load_hardware("h100-sxm")
# Llama 3 70B's block (config.json: hidden 8192, 64 heads in 8 groups, ffn 28672) and vocabulary, 4 layers deep
WIDE_LLAMA = ["--num-layers", "4", "--hidden-size", "8192", "--num-attention-heads", "64", "--num-query-groups", "8",
              "--ffn-hidden-size", "28672", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type",
              "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--vocab-size", "128256",
              "--seq-length", "8192", "--max-position-embeddings", "8192", "--global-batch-size", "16"]


def test_every_printed_pick_fits_by_the_dry_run_of_its_command_as_printed(capsys):
    assert main(["search", *WIDE_LLAMA, "--gpus", "8", "--hardware", "h100-sxm", "--top", "3"]) == 0
    printed = capsys.readouterr()
    commands = [line.split(" pretrain_gpt.py ", 1)[1] for line in printed.out.splitlines()
                if line.startswith("   torchrun --nproc-per-node 8 pretrain_gpt.py ")]
    assert len(commands) == 3
    for command in commands:
        assert main(["dry-run", "--hardware", "h100-sxm", "--world-size", "8", "--json", *shlex.split(command)]) == 0
        planned = json.loads(capsys.readouterr().out)
        assert max(stage["total_bytes"] for stage in planned.get("stages", [planned])) <= H100.gpu_memory_bytes
    assert "for global batch 16 (your flag), sequence 8,192 (your flag), bf16: 131,072 tokens a step" in printed.out

    progress = printed.err.splitlines()
    assert progress[0] == "search: enumerating the layouts on 8 GPUs"
    assert re.match(r"search: [\d,]+ layouts counted, [\d,]+ fit by the count; best by the count ", progress[1])
    verdicts = [line for line in progress if line.startswith("search:   fits: ") or "over the GPU" in line]
    assert len([line for line in progress if line.startswith("search: dry run ")]) == len(verdicts) >= 3
    assert "best so far" in verdicts[-1]
    for verdict in verdicts:  # the count runs under the dry run: it only prunes
        planned, counted = map(float, re.search(r"([\d.,]+) GiB by the dry run, ([\d.,]+) counted", verdict).groups())
        assert counted <= planned


def test_without_the_check_the_answer_says_its_picks_are_unchecked_and_a_batch_not_given_is_put_on_the_commands(capsys):
    shape = WIDE_LLAMA[:WIDE_LLAMA.index("--global-batch-size")]
    assert main(["search", *shape, "--gpus", "8", "--hardware", "h100-sxm", "--top", "1", "--no-dry-run-check"]) == 0
    out = capsys.readouterr().out
    assert "not checked by the dry run (--no-dry-run-check)" in out.splitlines()[0]
    # none given: the batch planned for is on the command, or pretrain_gpt.py would run micro batch x DP
    assert "for global batch 32 (none given: the search's default, on every command; --global-batch-size sets it)" \
        in out
    command = next(line for line in out.splitlines() if line.startswith("   torchrun"))
    assert " --global-batch-size 32 " in command and "(not checked by the dry run)" in out


def test_progress_while_counting_is_a_line_every_interval_at_most():
    lines, now = [], [0.0]
    progress = SearchProgress(lines.append, interval_s=2.0, clock=lambda: now[0])
    progress.started(64)
    for counted in range(1000):  # 1,000 layouts over 10 s
        now[0] += 0.01
        progress.counting(counted + 1, counted // 2)
    assert lines[0] == "search: enumerating the layouts on 64 GPUs" and 4 <= len(lines) - 1 <= 5
    assert lines[-1].startswith("search: ") and "layouts counted" in lines[-1] and "so far" in lines[-1]
