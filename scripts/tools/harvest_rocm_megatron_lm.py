"""Harvest a GPU vendor's Megatron-LM fork's launch scripts (ROCm/Megatron-LM, AMD's) into the replay corpus
(tests/replay_corpus/rocm_megatron_lm.json).

    python scripts/tools/harvest_rocm_megatron_lm.py --sources DIR --megatron-lm TREE --out FILE

Each script of SCRIPTS runs under bash with stand-ins first on PATH (`torchrun` records its arguments); only the
launches Megatron-LM accepts are kept."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

# the same check as the ModelZoo's: its launches' paths name no Blackwell GPU, so ARCH 9 (an MI300X/MI355X's
# compute capability as the fork reports it)
from scripts.tools.harvest_megatron_moe_modelzoo import megatron_verdict  # noqa: E402

REPO = "ROCm/Megatron-LM"
TREE = Path("/tmp/ROCm-Megatron-LM")
# (name, path, commit): each script at the commit of the version harvested (the fork's examples change often, and
# one commit holds only the files it changed in the stored copy this was taken from).
SCRIPTS = (
    ("rocm-llama3-70b", "examples/llama/train_llama3.sh", "02b8aa76d2fc0f99e0077ee932b771397db9c415"),
    ("rocm-llama2-70b", "examples/llama/train_llama2.sh", "02b8aa76d2fc0f99e0077ee932b771397db9c415"),
    ("rocm-qwen2-1.5b", "examples/qwen/train_qwen2.sh", "1090201787f0b7179678664eb81648f8f94852df"),
    ("rocm-mixtral-8x7b", "examples/mixtral/train_mixtral_moe.sh", "07c55f77e4956508d85b269a5910d5f1f8111b92"),
    ("rocm-qwen3-30b-a3b", "examples/qwen3/train_qwen3.sh", "0874a334fe277719265ff8c2ffebba10b8bbabad"),
    ("rocm-deepseek-v3-16b", "examples/deepseek_v3/train_deepseekv3.sh", "015290ee9417e9ed318df0c21d410e173d92997e"),
)

STANDINS = {
    "torchrun": '#!/bin/bash\nn=$(ls "$HARVEST_LAUNCHES" | wc -l)\nprintf \'%s\\0\' "$@" > "$HARVEST_LAUNCHES/$n"\n',
    "date": '#!/bin/bash\nexec DATE -u -d @0 "$@"\n',
    "rdma": "#!/bin/bash\necho '[]'\n",
    "wget": "#!/bin/bash\necho 'wget stand-in: nothing downloaded' >&2\nexit 1\n",
}
TORCH_STUB = "class cuda:\n    @staticmethod\n    def device_count():\n        return 8\n"


def script_text(path: str, commit: str, git_dir: str | None, sources: str | None) -> str:
    if git_dir:
        return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout
    return (Path(sources) / commit / path).read_text(encoding="utf-8")


def dry_run(name: str, path: str, commit: str, text: str, scratch: Path) -> dict | None:
    bin_dir, stub, launches = scratch / "bin", scratch / "stub", scratch / "launches"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for tool, body in STANDINS.items():
            (bin_dir / tool).write_text(body.replace("DATE", shutil.which("date") or "/bin/date"))
            (bin_dir / tool).chmod(0o755)
        (stub / "torch").mkdir(parents=True)
        (stub / "torch" / "__init__.py").write_text(TORCH_STUB)
    shutil.rmtree(launches, ignore_errors=True)
    launches.mkdir()
    shutil.rmtree(TREE, ignore_errors=True)
    (TREE / path).parent.mkdir(parents=True)
    (TREE / path).write_text(text, encoding="utf-8")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(scratch), "PYTHONPATH": str(stub),
           "HARVEST_LAUNCHES": str(launches)}
    subprocess.run(["bash", path], cwd=TREE, env=env, capture_output=True, text=True, timeout=120)
    recorded = sorted(launches.iterdir(), key=lambda file: int(file.name))
    if len(recorded) != 1:
        print(f"{name}: {len(recorded)} torchrun launches, not one: left out")
        return None
    words = recorded[0].read_text(encoding="utf-8").split("\0")[:-1]
    program = next(i for i, word in enumerate(words) if word.endswith("pretrain_gpt.py"))
    launcher = dict(zip(words[:program:2], words[1:program:2]))
    world_size = int(launcher["--nproc_per_node"]) * int(launcher["--nnodes"])
    return dict(name=name, path=path, commit=commit, world_size=world_size, argv=words[program + 1:],
                outcome="trains")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--git-dir", help="a clone of ROCm/Megatron-LM holding the commits in SCRIPTS")
    where.add_argument("--sources", help="a folder holding COMMIT/PATH for each script in SCRIPTS")
    parser.add_argument("--megatron-lm", help="Megatron-LM core_v0.16.1's tree beyond megatron.core")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    kept, harvested = [], 0
    with tempfile.TemporaryDirectory() as scratch:
        for name, path, commit in SCRIPTS:
            launch = dry_run(name, path, commit, script_text(path, commit, args.git_dir, args.sources), Path(scratch))
            if launch is None:
                continue
            harvested += 1
            verdict = megatron_verdict(launch, args.megatron_lm, Path(scratch)) if args.megatron_lm else "ACCEPTED"
            if verdict == "ACCEPTED":
                kept.append(launch)
            else:
                print(f"left out {name}: Megatron-LM {verdict}")
    shutil.rmtree(TREE, ignore_errors=True)
    rows = ",\n".join(" " + json.dumps(launch, ensure_ascii=False) for launch in kept)
    Path(args.out).write_text(f'{{\n "repo": {json.dumps(REPO)},\n "launches": [\n{rows}\n ]\n}}\n', encoding="utf-8")
    print(f"{len(kept)} of {harvested} launches written to {args.out}")


if __name__ == "__main__":
    main()
