"""The replay corpus: every GPT pretraining functional-test configuration of NVIDIA/Megatron-LM at one commit
(tests/functional_tests/test_cases/gpt/gpt3_*/model_config.yaml, 161 at d98e8a64), harvested whole by
scripts/tools/harvest_megatron_functional_tests.py into megatron_lm_functional_tests.json beside this file.

Each configuration's MODEL_ARGS are its command line as Megatron-LM's CI builds it (the script's docstring says
how), paths as written (shrink.py replaces them). `outcome` is the target, as for every corpus entry: "trains",
or "refused: TEXT" for a feature that does not exist here. The harvest took the outcome this repository's
parser gave at harvest time, and each refusal was read (docs/coming-from-megatron-deepspeed.md counts them by
reason); a feature built since moves its configurations to "trains" by a new harvest, never by editing a flag.

`HARVESTED` is all of them, for the counts; `LAUNCHES` leaves out the configurations that
megatron_lm_functional.py already replays (hand-taken at older commits, with their own resume tests), so no
configuration is replayed twice.

`MOE_HARVESTED`: the same for Megatron-LM's mixture-of-experts functional tests at the same commit
(test_cases/moe/* and test_cases/mixtral/*, the pretraining ones: 59 of 73, the harvest script's docstring says
which are skipped and why), harvested by the script's `--suite moe` into megatron_lm_moe_functional_tests.json.
None of them is in megatron_lm_functional.py, so all are replayed.
"""

import json
from pathlib import Path

from tests.replay_corpus import megatron_lm_functional
from tests.replay_corpus.launch import Launch, Source


def _harvested(file_name: str) -> tuple[Launch, ...]:
    data = json.loads(Path(__file__).with_name(file_name).read_text(encoding="utf-8"))
    return tuple(
        Launch(name=entry["name"], script=Source(data["repo"], entry["path"], data["commit"]),
               program="pretrain_gpt.py", world_size=data["gpus"],
               expanded=(f"one node of {data['gpus']} GPUs; MODEL_ARGS in file order ({entry['test_type']} test); "
                         "${...} paths: the CI's, as written; ${REPEAT}: 1"),
               argv=tuple(entry["argv"]), outcome=entry["outcome"])
        for entry in data["launches"])


HARVESTED = _harvested("megatron_lm_functional_tests.json")
MOE_HARVESTED = _harvested("megatron_lm_moe_functional_tests.json")

_CURATED = {launch.script.path for launch in megatron_lm_functional.LAUNCHES}
LAUNCHES = tuple(launch for launch in HARVESTED if launch.script.path not in _CURATED)
