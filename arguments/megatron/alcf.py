"""What ALCF's Megatron-DeepSpeed fork means by its optimizer and data choices, where that needs a start-up line or a
refusal: its `--optimizer adam` is torch.optim.Adam (L2 weight decay, not built here), its adamw our adam, and its
corpus flags act only under --data-file-list."""

from __future__ import annotations

from typing import Optional, Sequence

from arguments.megatron.defaults import ALCF_FORK


def typed_value(argv: Sequence[str], flag: str) -> Optional[str]:
    """The last value typed for `flag`, or None."""
    value = None
    for index, token in enumerate(argv):
        if token == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif token.startswith(flag + "="):
            value = token.split("=", 1)[1]
    return value


def alcf_problems(argv: Sequence[str], config, generation: Optional[str], megatron_launch: bool,
                  ds_fused_adam: bool) -> list[str]:
    """The fork's choices that would compute another update here, one problem line each: its adam (typed, or its
    default) with weight decay."""
    typed = typed_value(argv, "--optimizer")
    forks_adam = typed == "adam" or (typed is None and megatron_launch)
    if generation != ALCF_FORK or not forks_adam or config.optimizer.optimizer != "adam" \
            or config.optimizer.weight_decay == 0 or ds_fused_adam:
        return []
    return [f"--optimizer adam in ALCF's Megatron-DeepSpeed fork is torch.optim.Adam, whose --weight-decay "
            f"{config.optimizer.weight_decay:g} is an L2 term added to the gradient (megatron/optimizer/__init__.py "
            f"there), which is not built here: use --optimizer adamw (torch.optim.AdamW, this repository's adam) or "
            f"--weight-decay 0"]


def alcf_notes(argv: Sequence[str], config) -> list[str]:
    """The start-up lines of the fork's optimizer and corpus flags."""
    notes = []
    if typed_value(argv, "--optimizer") == "adamw":
        notes.append("> --optimizer adamw (ALCF's fork: torch.optim.AdamW) is adam here: the same AdamW update "
                     "(decoupled weight decay, bias-corrected moments, eps after the square root)")
    if config.optimizer.optimizer == "sophiag":
        notes.append("> --optimizer sophiag: ALCF's fork's Sophia-G (zero/sophia.py); its training never calls "
                     "SophiaG.update_hessian, so the Hessian estimate stays 0 and each update is --lr x sign(momentum), "
                     "clipped at 1, as there")
    data = config.data
    unread = [flag for flag, on in (("--shuffle-sample-in-corpus", data.shuffle_sample_in_corpus),
                                    ("--blend-sample-in-corpus", data.blend_sample_in_corpus)) if on]
    if unread and not data.data_file_list:
        notes.append(f"> {', '.join(unread)}: accepted, no effect without --data-file-list (ALCF's fork reads "
                     f"{'them' if len(unread) > 1 else 'it'} only where that list builds corpora)")
    return notes
