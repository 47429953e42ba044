"""The floors of the layout (docs/layout.md): a library module imports only from its own floor or below, and
no two modules import each other, directly or around a loop.

Lazy imports inside functions count: they are dependencies all the same, only deferred. The command
lines users type where they always have (`python -m zero.plan`, `python -m zero.perf_model`) are thin
entry points into the planner on the top floor, so they alone may import upward.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. A package's modules may import any package whose floor is at most their own; a folder is one floor
# (rendezvous/: what a rank does through the launch's store, below parallel/, whose comm.py keeps its collective log;
# resilience/: what runs with a training run, the rerun machine in the step and the fault injector the loop polls).
FLOORS = ("base", "rendezvous", "parallel", "data", "zero", "gpt", "families", "arguments", "checkpoint",
          "resilience", "training", "planner")
PACKAGES = tuple(dict.fromkeys(floor.split(".")[0] for floor in FLOORS))  # the top-level folders
ENTRY_POINTS = frozenset({"zero.plan", "zero.perf_model"})


def library_modules(root: Path) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:  # sub-packages too (arguments/megatron/, checkpoint/ours/)
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules `path` imports, anywhere in the file (`from pkg import module` included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            candidates = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in candidates:
            # `import zero.apply` names the module; `from zero.apply import apply_zero` names a function
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = library_modules(root)
    return {name: imported_modules(path, modules) - {name} for name, path in modules.items()}


def floor(module: str) -> int:
    """The floor of the longest entry of FLOORS that is the module or a package holding it."""
    parts = module.split(".")
    return next(FLOORS.index(".".join(parts[:n])) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in FLOORS)


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} (floor {FLOORS[floor(module)]}) imports {target} (floor {FLOORS[floor(target)]})"
                  for module, targets in graph.items() if module not in ENTRY_POINTS
                  for target in targets if floor(target) > floor(module))


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle once, as the path that closes it (depth-first search, colouring the nodes)."""
    cycles, state, path = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def test_no_library_module_imports_a_higher_floor():
    assert layering_violations(import_graph(ROOT)) == []


def test_no_import_cycles_between_modules():
    assert import_cycles(import_graph(ROOT)) == []


def test_every_package_is_on_a_floor():
    """A new top-level package must be given a floor, or the checks above would not see it."""
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "scripts"}
    assert packages <= set(PACKAGES), sorted(packages - set(PACKAGES))
    assert PACKAGES == FLOORS, "a floor is a whole top-level folder: no folder spans two"


def test_the_checks_fail_on_a_deliberate_violation(tmp_path):
    for package in FLOORS:
        (tmp_path / package.replace(".", "/")).mkdir()
        (tmp_path / package.replace(".", "/") / "__init__.py").write_text("")
    (tmp_path / "base" / "errors.py").write_text("from planner.dry_run import dry_run\n")  # upward
    (tmp_path / "rendezvous" / "liveness.py").write_text("from resilience.loop import poll\n")  # upward
    (tmp_path / "resilience" / "loop.py").write_text("from rendezvous.liveness import beat\n")  # downward
    (tmp_path / "planner" / "dry_run.py").write_text("def dry_run():\n    from planner import plan\n")
    (tmp_path / "planner" / "plan.py").write_text("import planner.dry_run\n")  # a loop with dry_run
    (tmp_path / "zero" / "plan.py").write_text("from planner.plan import command\n")  # an entry point: allowed
    graph = import_graph(tmp_path)
    assert layering_violations(graph) == [
        "base.errors (floor base) imports planner.dry_run (floor planner)",
        "rendezvous.liveness (floor rendezvous) imports resilience.loop (floor resilience)"]
    assert import_cycles(graph) == [["planner.dry_run", "planner.plan", "planner.dry_run"],
                                    ["rendezvous.liveness", "resilience.loop", "rendezvous.liveness"]]


def test_importing_the_model_does_not_import_the_data_pipeline():
    code = ("import sys, gpt.model; loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('data', 'arguments', 'checkpoint', 'training', 'planner')); print(loaded); assert not loaded")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("entry, words", [("zero.plan", "python -m zero.plan tables"),
                                          ("zero.perf_model", "python -m zero.perf_model --hardware")])
def test_entry_points_users_type_still_answer(entry, words):
    result = subprocess.run([sys.executable, "-m", entry, "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and words in result.stdout, result.stdout + result.stderr


def test_the_test_folders_mirror_the_packages():
    """tests/<floor>/ holds the tests of that package; tests/scripts/ those of scripts/; beside them only
    shared helpers, the fixtures and the replay corpus (real inputs, kept as their authors wrote them)."""
    folders = {path.name for path in (ROOT / "tests").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders - set(PACKAGES) == {"scripts", "fixtures", "replay_corpus"}, sorted(folders)
    for folder in folders & set(PACKAGES):
        assert any((ROOT / "tests" / folder).glob("test_*.py")), f"tests/{folder}/ holds no tests"


# The foreign formats' modules (Hugging Face folders, Megatron-LM's torch_dist, DeepSpeed's, DCP) and the names that
# carry them: the training floor reaches them through checkpoint/formats.py and checkpoint/inference_load.py only
FORMAT_MODULE = re.compile(r"^(checkpoint\.(hf|torch_dist|deepspeed|dcp\w*|megatron\w*)|arguments\.(hf_\w+|megatron|"
                           r"deepspeed)|families)(\.|$)")
FORMAT_NAME = re.compile(r"(^|_)(hf|torch_dist|dcp|deepspeed)(_|$)", re.IGNORECASE)


def format_imports(path: Path) -> list[str]:
    """The format modules and names `path` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if FORMAT_MODULE.match(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if FORMAT_MODULE.match(node.module):
                found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names if FORMAT_NAME.search(alias.name)]
    return found


def test_the_training_floor_names_no_checkpoint_format(tmp_path):
    """training/ asks the checkpoint registry (checkpoint/formats.py) which format a folder holds; it imports no
    format's module or name (a Megatron-LM convention of data order or reruns is no format)."""
    assert {str(path.relative_to(ROOT)): format_imports(path) for path in sorted((ROOT / "training").rglob("*.py"))
            if format_imports(path)} == {}
    bad = tmp_path / "bad.py"
    bad.write_text("from checkpoint.inference_load import is_hf_folder\nimport checkpoint.torch_dist.names\n")
    assert format_imports(bad) == ["checkpoint.inference_load.is_hf_folder", "checkpoint.torch_dist.names"]


# The foreign ring: the packages that translate Megatron-LM's and DeepSpeed's flags and files and Hugging Face's
# folders, and the doors through which the rest reaches them (each imports the ring where the user names a format:
# a flag, a JSON, a folder, a save format). Nothing else imports the ring; a new door is one line here.
RING = re.compile(r"^(arguments\.megatron|arguments\.deepspeed|checkpoint\.torch_dist|checkpoint\.deepspeed|"
                  r"checkpoint\.hf|families)(\.|$)")
RING_DOORS = {
    "arguments.parser", "arguments.config", "arguments.print_config", "arguments.batch_schedule",  # the flags
    "arguments.hf_config", "arguments.hf_dropout", "arguments.hf_folder", "arguments.hf_training_choices",  # a folder
    "checkpoint.formats", "checkpoint.run_start", "checkpoint.run_saves", "checkpoint.unfinished_save",  # --load/--save
    "checkpoint.inference_load", "checkpoint.convert_to_hf", "checkpoint.megatron_hf", "checkpoint.upcycling",  # tools
}


def test_only_the_doors_import_the_foreign_ring():
    graph = import_graph(ROOT)
    outside = {name: sorted(imp for imp in imports if RING.match(imp)) for name, imports in graph.items()
               if not RING.match(name) and name not in RING_DOORS}
    assert {name: imports for name, imports in outside.items() if imports} == {}
    assert all(any(RING.match(imp) for imp in graph[door]) for door in RING_DOORS)  # no door left open unused
