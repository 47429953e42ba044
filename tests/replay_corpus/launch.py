"""What an entry of the replay corpus holds: a real GPT pretraining launch, kept as its users run it.

Each `Launch` is one script's flag list exactly as the script hands it to its pretrain_gpt.py (or the forks'
pretrain_gpt2.py), after the shell has expanded the script's own defaults, and the DeepSpeed JSON it passes,
verbatim. Scripts that write their JSON (a heredoc, or `sed` over a template) keep the text they write; `json` then
names the script or template it came from. A standalone JSON (no script of its own) is launched with SIMPLE_LAUNCH,
a 345M-model flag list of ours that leaves the batch to the JSON.

The lists were taken by running each script under bash at the commit named, with stub launchers (`deepspeed`,
`torchrun`, `python`, `srun`) recording their arguments and stubs for what a login node would answer (`nvidia-smi`:
one node of 8 GPUs; `ssh`: no checkpoint found); `expanded` says which variables decided the values and the launch
environment (nodes x GPUs: `world_size`). Placeholders (`<Specify path>`), site variables, `whoami`, $HOSTNAME,
`date` and a script's own folder are parts of paths, which `shrink.py` replaces anyway.

`outcome` is what this repository must do with the launch once `shrink.py` has made it small: "trains" (3
iterations on 2 CPU ranks), or "refused: TEXT": exit status 2 and one error line containing TEXT, only for a feature
that would change the math and does not exist here. This is data, not code to run: nothing here is imported from
those repositories, and the files it names are not copied beyond the flag lists and JSON texts below."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Source:
    repo: str  # owner/name on GitHub
    path: str
    commit: str

    def __str__(self) -> str:
        return f"{self.repo}/{self.path}@{self.commit[:8]}"


@dataclass(frozen=True)
class Launch:
    name: str
    script: Optional[Source]  # None: a standalone JSON, launched with SIMPLE_LAUNCH
    program: str  # the entry point the script runs
    world_size: int  # GPUs the script launches on
    expanded: str  # the script's variables that decided the values below
    argv: tuple[str, ...]  # what the script passes after the program, token for token
    outcome: str  # "trains" or "refused: TEXT"
    json: Optional[Source] = None  # the JSON file, or the script/template that writes it
    json_generated: bool = False  # json_text is what the script wrote, not the file itself
    json_text: Optional[str] = None

    @property
    def refusal(self) -> Optional[str]:
        """TEXT of "refused: TEXT", or None for a launch that trains."""
        return self.outcome.split(": ", 1)[1] if self.outcome.startswith("refused: ") else None


# The launch for a standalone JSON: Megatron-LM's 345M model and data flags; the JSON sets batch and
# precision. Values in <> are paths, replaced by shrink.py like every other path.
SIMPLE_LAUNCH = (
    "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
    "--max-position-embeddings", "1024", "--train-iters", "500000", "--data-path", "<data prefix>",
    "--vocab-file", "<gpt2-vocab.json>", "--merge-file", "<gpt2-merges.txt>", "--deepspeed",
    "--deepspeed_config", "<ds_config.json>",
)
