"""Harvest the Megatron-Core MoE team's best-practice launches (Megatron-MoE-ModelZoo) into the replay corpus
(tests/replay_corpus/megatron_moe_modelzoo.json).

    python scripts/tools/harvest_megatron_moe_modelzoo.py --git-dir DIR --commit REV --megatron-lm TREE --out FILE

Each run_*.sh runs under bash with DRY_RUN=1 and a stand-in `yq`, printing its training command; only the launches
Megatron-LM's parse_args accepts are kept."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = "yanring/Megatron-MoE-ModelZoo"
# Where the commit's tree is run: a fixed folder, as a user's clone, so that the paths the scripts derive from it
# (--data-cache-path ${WORKSPACE}/data_cache) are the same at every harvest.
TREE = Path("/tmp/Megatron-MoE-ModelZoo")

YQ = '''#!PYTHON
import sys, yaml
expr, path = sys.argv[1], sys.argv[2]
root = yaml.compose(open(path).read())
section = lambda name: next((v for k, v in root.value if k.value == name), None)
if ".MODEL_ARGS | to_entries" in expr:
    for k, v in section("MODEL_ARGS").value:
        if v.value != "false":
            print(k.value + " " + ("" if v.value == "true" else v.value))
elif ".ENV_VARS | to_entries" in expr:
    for k, v in getattr(section("ENV_VARS"), "value", []):
        print(k.value + "=" + v.value)
elif expr.startswith('.MODEL_ARGS."'):
    value = next((v for k, v in section("MODEL_ARGS").value if k.value == expr.split('"')[1]), None)
    print("null" if value is None else value.value)
else:
    sys.exit("yq stand-in: a query sbatch_benchmarking.sh does not ask: " + expr)
'''

# Megatron-LM's parse_args and validate_args on one launch (argv after the script; WORLD_SIZE and ARCH in the env).
MEGATRON_CHECK = '''
import os, sys, traceback, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, os.environ["MEGATRON_LM_TREE"])
sys.argv = ["pretrain_gpt.py", *sys.argv[1:]]
import torch
torch.cuda.get_device_capability = lambda *a, **k: (int(os.environ["ARCH"]), 0)
import megatron.training.arguments as arguments
arguments.is_te_min_version = lambda *a, **k: True
arguments.get_device_arch_version = lambda: int(os.environ["ARCH"])
try:
    arguments.validate_args(arguments.parse_args(), {})
    print("ACCEPTED")
except SystemExit as error:
    print(f"EXIT {error.code}")
except BaseException as error:
    where = traceback.extract_tb(error.__traceback__)[-1]
    print(f"REFUSED {type(error).__name__}: {error} @{os.path.basename(where.filename)}:{where.lineno}")
'''


def dry_runs(git_dir: str, commit: str, scratch: Path) -> list[dict]:
    names = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", commit, "best_practice"],
                           check=True, capture_output=True, text=True).stdout.split()
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    (bin_dir / "yq").write_text(YQ.replace("PYTHON", sys.executable))
    (bin_dir / "yq").chmod(0o755)
    launches = []
    for script in (name for name in names if name.endswith(".sh")):
        tree = TREE
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir()
        subprocess.run(f"git --git-dir={git_dir} archive {commit} | tar x -C {tree}", shell=True, check=True)
        clusters = tree / "cluster_configs" / "benchmarking"
        shutil.copy(clusters / "template.conf", clusters / "CW.conf")
        env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(scratch), "DRY_RUN": "1",
               "DATA_PATH": "<DATA_PATH>", "LOAD_PATH": "<LOAD_PATH>"}
        text = subprocess.run(["bash", script], cwd=tree, env=env, capture_output=True, text=True).stdout
        nodes = re.findall(r"#SBATCH --nodes=(\d+)", text)
        tasks = re.findall(r"#SBATCH --ntasks-per-node=(\d+)", text)
        commands = re.findall(r"=== Full Training Command ===\n(.*?)\n=== End of Full Training Command ===", text, re.S)
        source = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{script}"], check=True,
                                capture_output=True, text=True).stdout.replace("\\\n", " ")
        lines = [re.sub(r"\s+", " ", line.split("bash")[0]).strip() for line in source.splitlines()
                 if "sbatch_benchmarking.sh" in line and not line.lstrip().startswith("#")]
        for index, command in enumerate(commands):
            words = command.split()
            assert words[0] == "python" and words[1].endswith("pretrain_gpt.py"), words[:2]
            folder, stem = script.split("/")[1], Path(script).stem.replace("_", "-").lower()
            rest = stem.removeprefix("run-").removeprefix(folder + "-").removeprefix(folder.split("-")[0] + "-")
            launches.append(dict(name=f"modelzoo-{folder}-{rest}" + (f"-{index + 1}" if len(commands) > 1 else ""),
                                 path=script, world_size=int(nodes[index]) * int(tasks[index]),
                                 invocation=lines[index], argv=words[2:], outcome="trains"))
    shutil.rmtree(TREE, ignore_errors=True)
    return launches


def megatron_verdict(launch: dict, tree: str, scratch: Path) -> str:
    check = scratch / "megatron_check.py"
    check.write_text(MEGATRON_CHECK)
    blackwell = any(gpu in launch["path"] for gpu in ("b200", "gb200", "gb300"))
    env = dict(os.environ, MEGATRON_LM_TREE=tree, WORLD_SIZE=str(launch["world_size"]), RANK="0", LOCAL_RANK="0",
               ARCH="10" if blackwell else "9",
               CUDA_DEVICE_MAX_CONNECTIONS="32" if "--overlap-moe-expert-parallel-comm" in launch["argv"] else "1")
    result = subprocess.run([sys.executable, str(check), *launch["argv"]], env=env, capture_output=True, text=True)
    verdict = (result.stdout.strip().splitlines() or ["?"])[-1]
    if verdict.startswith("EXIT"):
        verdict += ": " + (result.stderr.strip().splitlines() or [""])[-1]
    return verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git-dir", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--megatron-lm", help="Megatron-LM core_v0.16.1's tree beyond megatron.core")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    commit = subprocess.run(["git", "--git-dir", args.git_dir, "rev-parse", args.commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        launches = dry_runs(args.git_dir, commit, Path(scratch))
        kept = []
        for launch in launches:
            verdict = megatron_verdict(launch, args.megatron_lm, Path(scratch)) if args.megatron_lm else "ACCEPTED"
            if verdict == "ACCEPTED":
                kept.append(launch)
            else:
                print(f"left out {launch['name']}: Megatron-LM {verdict}")
    rows = ",\n".join(" " + json.dumps(launch, ensure_ascii=False) for launch in kept)
    Path(args.out).write_text(f'{{\n "repo": {json.dumps(REPO)},\n "commit": {json.dumps(commit)},\n "launches": [\n'
                              f"{rows}\n ]\n}}\n", encoding="utf-8")
    print(f"{len(kept)} of {len(launches)} launches written to {args.out}")


if __name__ == "__main__":
    main()
