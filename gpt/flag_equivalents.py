"""An unknown flag is answered with the closest known name, and with this program's equivalent when it
is a Megatron-LM or DeepSpeed flag that is not accepted as such.

One error line lists every unknown flag at once, each with its hint, so a script ported from
Megatron-LM needs one edit round, not one per flag.
"""

from __future__ import annotations

import argparse
import difflib

# Megatron-LM / DeepSpeed-Megatron flags that are not accepted, and what to use instead.
EQUIVALENTS: dict[str, str] = {
    "--data-cache-path": "--data-cache-dir",
    "--valid-data-path": "--data-path with --split (valid documents come from the split)",
    "--test-data-path": "--data-path with --split (test documents come from the split)",
    "--swiglu": "not implemented: the MLP here is GPT-2's GeLU (--activation gelu or gelu_tanh)",
    "--position-embedding-type": "not implemented: positions are GPT-2's learned embeddings",
    "--use-rotary-position-embeddings": "not implemented: positions are GPT-2's learned embeddings",
    "--normalization": "not implemented: LayerNorm as in GPT-2",
    "--untie-embeddings-and-output-weights": "not implemented: the output layer is tied to the embedding",
    "--group-query-attention": "not implemented: multi-head attention as in GPT-2",
    "--num-query-groups": "not implemented: multi-head attention as in GPT-2",
    "--disable-bias-linear": "not implemented: linear layers have biases as in GPT-2",
    "--num-layers-per-virtual-pipeline-stage": "pipeline parallelism is not implemented; ZeRO replaces it "
                                               "(--zero-stage 3)",
    "--context-parallel-size": "not implemented: use --checkpoint-activations --partition-activations for long "
                               "sequences",
    "--expert-model-parallel-size": "this GPT has no mixture-of-experts layers",
    "--num-experts": "this GPT has no mixture-of-experts layers",
    "--transformer-impl": "one implementation: plain PyTorch layers with SDPA attention",
    "--use-mcore-models": "one implementation: plain PyTorch layers with SDPA attention",
    "--log-throughput": "tokens/s and TFLOP/s are always logged",
    "--timing-log-level": "iteration time is always logged (iter_time_s)",
    "--log-timers-to-tensorboard": "--tensorboard-dir writes every metrics record's values",
    "--log-validation-ppl-to-tensorboard": "--tensorboard-dir writes the validation loss and ppl",
    "--log-memory-to-tensorboard": "--tensorboard-dir writes memory_bytes; --report-memory adds per-rank detail",
    "--wandb-save-dir": "W&B writes beside --metrics-file",
    "--use-dist-ckpt": "checkpoints are sharded and load at any DP size and stage already",
    "--ckpt-format": "checkpoints are safetensors shards with a metadata.json",
    "--exit-on-missing-checkpoint": "a --load that names no checkpoint is an error already",
    "--fp8-format": "fp8 is not implemented: use --bf16 or --fp16",
    "--fp32-residual-connection": "not implemented: the residual stream follows the training precision",
    "--apply-query-key-layer-scaling": "no effect needed: SDPA computes the softmax in fp32 accumulations",
    "--attention-softmax-in-fp32": "no effect needed: SDPA computes the softmax in fp32 accumulations",
    "--cpu-optimizer": "ZeRO-Offload is not implemented (on the roadmap): use --zero-stage 2 or 3",
    "--cpu-torch-adam": "ZeRO-Offload is not implemented (on the roadmap): use --zero-stage 2 or 3",
    "--zero-reduce-scatter": "--reduce-scatter (on by default)",
    "--zero-contigious-gradients": "--contiguous-gradients (always on)",
    "--zero-reduce-bucket-size": "--reduce-bucket-size",
    "--zero-allgather-bucket-size": "--allgather-bucket-size",
    "--remote-device": "offload is not implemented: use --zero-stage 3 over more GPUs",
    "--use-pin-memory": "offload is not implemented, so there is no host copy to pin",
    "--profile-backward": "--profile-checkpointing times the checkpointed groups",
}


def unknown_flags_message(tokens: list[str], parser: argparse.ArgumentParser) -> str:
    """'unrecognized arguments: --x 1 --y' followed by a hint for each unknown flag."""
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    hints = []
    for token in tokens:
        flag = token.split("=", 1)[0]
        if not flag.startswith("-"):
            continue
        if flag in EQUIVALENTS:
            hints.append(f"{flag}: {EQUIVALENTS[flag]}")
            continue
        nearest = difflib.get_close_matches(flag, known + list(EQUIVALENTS), n=1, cutoff=0.6)
        if nearest and nearest[0] in EQUIVALENTS:
            hints.append(f"{flag}: did you mean {nearest[0]}? ({EQUIVALENTS[nearest[0]]})")
        elif nearest:
            hints.append(f"{flag}: did you mean {nearest[0]}?")
        else:
            hints.append(f"{flag}: no flag of that name or near it (python pretrain_gpt.py --help lists them)")
    return f"unrecognized arguments: {' '.join(tokens)}" + (f" ({'; '.join(hints)})" if hints else "")
