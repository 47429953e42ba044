"""Harvest Megatron-LM's GPT and MoE pretraining functional-test configurations into the replay corpus.

    python scripts/tools/harvest_megatron_functional_tests.py --git-dir DIR --commit REV [--suite moe] --out FILE

Each pretraining model_config.yaml becomes one launch, as Megatron-LM's CI builds it, with this repository's
outcome: "trains", or the flag it refuses."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

CASES = "tests/functional_tests/test_cases/"
# suite: (folder under CASES, the configurations' name prefix there, the launch name's prefix)
SUITES = {"gpt": (("gpt", "gpt3_", "megatron-lm-ft-"),),
          "moe": (("moe", "", "megatron-lm-ft-moe-"), ("mixtral", "", "megatron-lm-ft-mixtral-"))}
GPUS = 8
FIRST_REPEAT = "1"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", git_dir, *args], check=True, capture_output=True, text=True).stdout


def model_args_argv(text: str) -> list[str]:
    """MODEL_ARGS as _run_training.sh turns them into arguments (see the module docstring)."""
    root = yaml.compose(text)
    section = next((value for key, value in root.value if key.value == "MODEL_ARGS"), None)
    if section is None:
        return []
    argv: list[str] = []
    for key, value in exploded(section):
        if isinstance(value, yaml.SequenceNode):
            argv += [key.value, *(item.value for item in value.value)]
            continue
        text = value.value.strip()
        if text == "true":
            argv.append(key.value)
        elif text == "":
            argv.append(key.value)  # yq: `select(.value != "")` drops the value, the key stays
        elif re.fullmatch(r"\[[^]]+\]", text):
            argv += [key.value, *text[1:-1].split()]
        else:
            argv += [key.value, text]  # ( ), spaces and shell characters: one quoted argument
    return argv


def exploded(mapping: yaml.MappingNode) -> list[tuple[yaml.Node, yaml.Node]]:
    """The mapping's pairs with YAML merge keys (`<<: *BASE`) expanded in place, as yq's `explode(.)`: the
    merged mapping's pairs where the merge key stands, less the keys the mapping itself sets."""
    own = {key.value for key, _ in mapping.value if key.value != "<<"}
    pairs = []
    for key, value in mapping.value:
        if key.value == "<<":
            merged = value.value if isinstance(value, yaml.SequenceNode) else [value]
            for source in merged:
                pairs += [pair for pair in exploded(source) if pair[0].value not in own]
        else:
            pairs.append((key, value))
    return pairs


def ci_test_type(text: str) -> str:
    return str(yaml.safe_load(text).get("TEST_TYPE", "regular"))


def ci_mode(text: str) -> str:
    """Which program the CI runs: `MODE` (inference, rl, ...), pretraining when absent."""
    return str(yaml.safe_load(text).get("MODE", "pretraining"))


def harvest(git_dir: str, commit: str, suite: str = "gpt") -> tuple[list[dict], list[str]]:
    """The suite's pretraining launches, and the paths of the configurations skipped as not pretraining."""
    launches, skipped = [], []
    for folder, prefix, name_prefix in SUITES[suite]:
        cases = f"{CASES}{folder}/"
        names = [line.rsplit("/", 1)[-1] for line in git(git_dir, "ls-tree", "--name-only", commit, cases).split()]
        for name in sorted(name for name in names if name.startswith(prefix)):
            path = f"{cases}{name}/model_config.yaml"
            try:
                text = git(git_dir, "show", f"{commit}:{path}")
            except subprocess.CalledProcessError:
                continue  # a folder without a model config (golden values only)
            if ci_mode(text) != "pretraining":
                skipped.append(f"{path} (MODE: {ci_mode(text)})")
                continue
            argv = [token.replace("${REPEAT}", FIRST_REPEAT) for token in model_args_argv(text)]
            launches.append({"name": f"{name_prefix}{name}", "path": path, "test_type": ci_test_type(text),
                             "argv": argv})
    return launches, skipped


def outcome_today(argv: list[str]) -> str:
    """What this repository's parser (and the entry point's late checks) says to the shrunk launch."""
    from arguments.config import ConfigError
    from arguments.parser import parse_arguments
    from tests.replay_corpus.launch import Launch
    from tests.replay_corpus.shrink import LocalFiles, shrink
    from training.late_checks import LATE_CHECKS

    launch = Launch(name="x", script=None, program="pretrain_gpt.py", world_size=GPUS, expanded="", argv=tuple(argv),
                    outcome="trains")
    shrunk = shrink(launch, LocalFiles("/tmp/corpus/data_text_document", "/tmp/corpus/tokenizer", 512, "/tmp/out"))
    try:
        parse_arguments(shrunk.argv, late_checks=LATE_CHECKS)  # as pretrain_gpt.py parses (fp8 on this device...)
    except ConfigError as error:
        first = str(error).split("; ")[0].split(": (1) ")[-1]
        return "refused: " + first.split(": ")[0]  # what is refused (the flag as given), not the wording of why
    return "trains"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git-dir", required=True, help="a Megatron-LM git repository (a bare mirror is enough)")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--suite", choices=sorted(SUITES), default="gpt",
                        help="gpt: test_cases/gpt/gpt3_*; moe: test_cases/moe/* and test_cases/mixtral/*")
    args = parser.parse_args(argv)
    commit = git(args.git_dir, "rev-parse", args.commit).strip()
    launches, skipped = harvest(args.git_dir, commit, args.suite)
    for path in skipped:
        print(f"skipped, not pretraining: {path}")
    for launch in launches:
        launch["outcome"] = outcome_today(launch["argv"])
    # one launch a line: a new harvest's diff shows which configurations changed
    head = json.dumps({"repo": "NVIDIA/Megatron-LM", "commit": commit, "gpus": GPUS})[:-1]
    body = ",\n".join(json.dumps(launch) for launch in launches)
    args.out.write_text(f'{head}, "launches": [\n{body}\n]}}\n')
    reasons = Counter(launch["outcome"] for launch in launches)
    for reason, count in reasons.most_common():
        print(f"{count:4d}  {reason}")
    print(f"{len(launches)} launches, {reasons['trains']} accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
