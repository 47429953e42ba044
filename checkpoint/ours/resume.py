"""A resume from this project's own checkpoint, as the format registry calls it: metadata checked, every file verified
by a share of the ranks, then the load.
"""

from __future__ import annotations

from pathlib import Path

from checkpoint.format import read_metadata
from checkpoint.ours.sharded import ResumePoint, load_checkpoint, verify_for_job
from checkpoint.resume_checks import check_resume


def _metadata(iteration_dir: Path, config) -> dict:
    return read_metadata(iteration_dir)


def _verify(iteration_dir: Path, metadata: dict, state, check_content: bool) -> None:
    verify_for_job(iteration_dir, metadata, state, check_content=check_content)


def check_start(config, state, iteration_dir: Path, log, batch):
    return check_resume(_metadata, _verify, config, state, iteration_dir, log, batch)


def load_resume(iteration_dir: Path, model, optimizer, rng, state, model_config, *, load_optimizer: bool,
                load_rng: bool, finetune: bool) -> ResumePoint:
    return load_checkpoint(iteration_dir, model, optimizer, rng, state, load_optimizer=load_optimizer,
                           load_rng=load_rng, finetune=finetune, verify=False)  # check_start verified every file
