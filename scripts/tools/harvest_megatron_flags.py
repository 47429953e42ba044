"""Harvest the command-line flags of Megatron-LM, its forks and DeepSpeed from their own argument files into
arguments/megatron/flags_harvested.json: each file read at one commit with `git show` and parsed with `ast`, never
imported (dataclass-built groups rebuilt as argument_utils.py builds them).

    MIRRORS=DIR bash scripts/tools/harvest_megatron_flags.sh     # the sources, then this script"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SHAPE_KEYS = ("action", "nargs", "type", "choices", "const")


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", git_dir, *args], check=True, capture_output=True, text=True).stdout


@dataclass
class Tree:
    """One commit of one repository: files read on demand, classes found by name."""
    git_dir: str
    commit: str
    _files: dict = field(default_factory=dict)
    _classes: dict = field(default_factory=dict)

    def read(self, path: str) -> str:
        if path not in self._files:
            self._files[path] = git(self.git_dir, "show", f"{self.commit}:{path}")
        return self._files[path]

    def find_class(self, name: str) -> Optional[ast.ClassDef]:
        """The class `name` defined at the top level of a .py file under megatron/ (core first)."""
        if name not in self._classes:
            found = None
            try:
                hits = git(self.git_dir, "grep", "-l", "-E", rf"^class {name}\b", self.commit, "--", "*.py")
            except subprocess.CalledProcessError:
                hits = ""
            paths = sorted((line.split(":", 1)[1] for line in hits.splitlines()),
                           key=lambda p: (not p.startswith("megatron/core"), p))
            for path in paths:
                for node in ast.parse(self.read(path)).body:
                    if isinstance(node, ast.ClassDef) and node.name == name:
                        found = node
                        break
                if found is not None:
                    break
            self._classes[name] = found
        return self._classes[name]


def literal(node: Optional[ast.AST]) -> Any:
    """A literal's value, or `ast.unparse` text wrapped as {"expr": ...} when it is not one."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return {"expr": ast.unparse(node)}


def name_of(node: Optional[ast.AST]) -> Optional[str]:
    """`int`, `str2bool`, `argparse.BooleanOptionalAction` -> its last name; a lambda -> "lambda"."""
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Lambda):
        return "lambda"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node)


def clean(value: Any) -> Any:
    """Make a literal JSON-safe (tuples -> lists, non-finite floats and sets -> text)."""
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return repr(value)
    if isinstance(value, (set, frozenset, bytes, complex)):
        return {"expr": repr(value)}
    return value


def shape_from_call(call: ast.Call) -> tuple[list[str], dict, list[str]]:
    """(option strings, shape, problems) of one add_argument call."""
    options, problems = [], []
    for arg in call.args:
        value = literal(arg)
        if isinstance(value, str) and value.startswith("-"):
            options.append(value)
        else:
            problems.append(f"line {call.lineno}: option string not a literal: {ast.unparse(arg)}")
    keywords = {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}
    shape: dict[str, Any] = {"action": name_of(keywords.get("action")) or "store"}
    if "nargs" in keywords:
        shape["nargs"] = clean(literal(keywords["nargs"]))
    if "type" in keywords:
        shape["type"] = name_of(keywords["type"])
    if "choices" in keywords:
        shape["choices"] = clean(literal(keywords["choices"]))
    if "const" in keywords:
        shape["const"] = clean(literal(keywords["const"]))
    if "dest" in keywords:
        shape["dest"] = clean(literal(keywords["dest"]))
    elif options:  # argparse's rule: the first long option string, dashes made underscores
        first = next((option for option in options if option.startswith("--")), options[0])
        shape["dest"] = first.lstrip("-").replace("-", "_")
    if "default" in keywords:
        shape["default"] = clean(literal(keywords["default"]))
    return options, shape, problems


# ---- Megatron-LM's ArgumentGroupFactory, rebuilt from the dataclass source ------------------------

def _subscript_parts(node: ast.Subscript) -> list[ast.AST]:
    inner = node.slice
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def _enum_members(tree: Tree, name: str) -> Optional[list[str]]:
    cls = tree.find_class(name)
    if cls is None or not any(name_of(base) in ("Enum", "IntEnum", "StrEnum") for base in cls.bases):
        return None
    return [target.id for stmt in cls.body if isinstance(stmt, ast.Assign)
            for target in stmt.targets if isinstance(target, ast.Name)]


def type_kwargs(tree: Tree, node: ast.AST) -> Optional[dict]:
    """argument_utils._extract_type on an annotation's AST; None where it would fail."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        node = ast.parse(node.value, mode="eval").body
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
        if isinstance(node.right, ast.Constant) and node.right.value is None:
            return type_kwargs(tree, node.left)
        return None
    if isinstance(node, ast.Subscript):
        origin, parts = name_of(node.value), _subscript_parts(node)
        if origin == "Optional":
            return type_kwargs(tree, parts[0])
        if origin == "Union":
            if len(parts) == 2 and isinstance(parts[1], ast.Constant) and parts[1].value is None:
                return type_kwargs(tree, parts[0])
            return None
        if origin in ("list", "List") and len(parts) == 1:
            inner = type_kwargs(tree, parts[0])
            return None if inner is None else {**inner, "nargs": "+"}
        if origin == "Literal":
            values = [literal(part) for part in parts]
            return {"type": type(values[0]).__name__, "choices": clean(values)}
        return None
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = name_of(node)
        if name in ("int", "float", "str", "bool"):
            return {"type": name}
        members = _enum_members(tree, name)
        if members is not None:
            return {"type": name, "choices": members}
        return {"type": name}
    return None


def dataclass_fields(tree: Tree, name: str) -> list[tuple[str, ast.AnnAssign]]:
    """(field name, its AnnAssign) of a dataclass, base classes' fields first, as dataclasses.fields."""
    cls = tree.find_class(name)
    if cls is None:
        raise LookupError(f"class {name} not found")
    ordered: dict[str, ast.AnnAssign] = {}
    for base in cls.bases:
        base_name = name_of(base)
        if base_name not in ("object", "ABC", "Generic") and tree.find_class(base_name) is not None:
            ordered.update(dataclass_fields(tree, base_name))
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if name_of(stmt.annotation) == "ClassVar" or (isinstance(stmt.annotation, ast.Subscript)
                                                         and name_of(stmt.annotation.value) == "ClassVar"):
                continue
            ordered.pop(stmt.target.id, None)
            ordered[stmt.target.id] = stmt
    return list(ordered.items())


def factory_arguments(tree: Tree, class_name: str, exclude: set[str]) -> tuple[list[tuple[list[str], dict]], list[str]]:
    """The (option strings, shape) ArgumentGroupFactory(class_name, exclude).build_group adds."""
    added, problems = [], []
    for name, stmt in dataclass_fields(tree, class_name):
        if name in exclude:
            continue
        default, meta, init = None, {}, True
        value = stmt.value
        if isinstance(value, ast.Call) and name_of(value.func) == "field":
            kws = {kw.arg: kw.value for kw in value.keywords}
            if "init" in kws and literal(kws["init"]) is False:
                init = False
            default = literal(kws["default"]) if "default" in kws else None
            if "default_factory" in kws:
                default = {"expr": ast.unparse(kws["default_factory"]) + "()"}
            metadata = kws.get("metadata")
            if isinstance(metadata, ast.Dict):
                for key, val in zip(metadata.keys, metadata.values):
                    if literal(key) == "argparse_meta" and isinstance(val, ast.Dict):
                        for mkey, mval in zip(val.keys, val.values):
                            key_name = literal(mkey)
                            meta[key_name] = (name_of(mval) if key_name in ("type", "action")
                                              else clean(literal(mval)))
        elif value is not None:
            default = literal(value)
        if not init:
            continue
        shape: dict[str, Any] = {"dest": name}
        options = ["--" + name.replace("_", "-")]
        inferred = type_kwargs(tree, stmt.annotation)
        if inferred is None and not meta:
            problems.append(f"{class_name}.{name}: type {ast.unparse(stmt.annotation)} not inferable and no "
                            f"argparse_meta (Megatron's factory would fail)")
            continue
        shape.update(inferred or {})
        if shape.get("type") == "bool":
            shape.pop("type")
            if default is True:
                shape["action"] = "store_false"
                options = ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
            else:
                shape["action"] = "store_true"
        else:
            shape.setdefault("action", "store")
        shape["default"] = clean(default)
        for key, val in meta.items():
            if key == "arg_names":
                options = list(val)
            elif key != "help":
                shape[key] = val
        added.append((options, shape))
    return added, problems


def _exclude_list(node: Optional[ast.AST], assigned: dict[str, ast.AST]) -> set[str]:
    if node is None:
        return set()
    if isinstance(node, ast.Name) and node.id in assigned:
        node = assigned[node.id]
    value = literal(node)
    return set(value) if isinstance(value, (list, tuple, set)) else set()


# ---- one source file --------------------------------------------------------------------------------

def harvest_file(tree: Tree, path: str) -> tuple[list[tuple[list[str], dict]], list[str]]:
    module = ast.parse(tree.read(path))
    found, problems = [], []
    functions = [node for node in ast.walk(module) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen_calls = set()
    for scope in [module] + functions:
        assigned = {target.id: stmt.value for stmt in ast.walk(scope) if isinstance(stmt, ast.Assign)
                    for target in stmt.targets if isinstance(target, ast.Name)}
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or id(node) in seen_calls:
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                seen_calls.add(id(node))
                options, shape, trouble = shape_from_call(node)
                problems += trouble
                if shape["action"] == "BooleanOptionalAction":  # argparse adds the --no- spelling itself
                    options += ["--no-" + option[2:] for option in options if option.startswith("--")]
                if options:
                    found.append((options, shape))
            elif name_of(node.func) == "patch_if_not_exist" and len(node.args) >= 2:
                # Pai-Megatron-Patch's megatron_patch/arguments.py: patch_if_not_exist(group, "--name", type=...,
                # default=..., choices=..., help=...) is add_argument("--name", ...) unless Megatron defines it
                seen_calls.add(id(node))
                call = ast.Call(func=node.func, args=node.args[1:2], keywords=node.keywords)
                call.lineno = node.lineno
                options, shape, trouble = shape_from_call(call)
                problems += trouble
                if options:
                    found.append((options, shape))
            elif name_of(node.func) == "ArgumentGroupFactory" and scope is not module:
                seen_calls.add(id(node))
                class_name = name_of(node.args[0]) if node.args else None
                kws = {kw.arg: kw.value for kw in node.keywords}
                exclude_node = kws.get("exclude", node.args[1] if len(node.args) > 1 else None)
                try:
                    added, trouble = factory_arguments(tree, class_name, _exclude_list(exclude_node, assigned))
                except LookupError as error:
                    problems.append(f"line {node.lineno}: ArgumentGroupFactory({class_name}): {error}")
                    continue
                found += added
                problems += trouble
    return found, problems


def shape_key(shape: dict) -> str:
    return json.dumps({key: shape[key] for key in SHAPE_KEYS if key in shape}, sort_keys=True)


def harvest(sources: list[list[str]], unavailable: list[str]) -> dict:
    flags: dict[str, dict] = {}
    described = []
    for label, repository, git_dir, rev, path in sources:
        commit = git(git_dir, "rev-parse", f"{rev}^{{commit}}").strip()
        date = git(git_dir, "log", "-1", "--format=%cs", commit).strip()
        tree = Tree(git_dir, commit)
        found, problems = harvest_file(tree, path)
        options_here = set()
        for options, shape in found:
            for option in options:
                options_here.add(option)
                entry = flags.setdefault(option, {"sources": [], "shapes": {}})
                if label not in entry["sources"]:
                    entry["sources"].append(label)
                key = shape_key(shape)
                dest = shape.get("dest", option.lstrip("-").replace("-", "_"))
                record = entry["shapes"].setdefault(key, {**{k: shape[k] for k in SHAPE_KEYS if k in shape},
                                                          "dest": dest, "sources": []})
                if label not in record["sources"]:
                    record["sources"].append(label)
                if "default" in shape and shape["default"] is not None:  # Megatron's defaults, by source
                    entry.setdefault("defaults", {})[label] = shape["default"]
        described.append({"label": label, "repository": repository, "path": path, "ref": rev, "commit": commit,
                          "date": date, "option_strings": len(options_here), "not_read": problems})
    ordered = {}
    for option in sorted(flags):
        entry = flags[option]
        ordered[option] = {"sources": entry["sources"], "shapes": list(entry["shapes"].values())}
        if entry.get("defaults"):
            ordered[option]["defaults"] = entry["defaults"]
    return {
        "about": "Option strings of Megatron-LM, Megatron-DeepSpeed, DeepSpeedExamples' Megatron forks, "
                 "DeepSpeed and the pretraining forks (llm-jp's and swiss-ai's Megatron-LM, Pai-Megatron-Patch), "
                 "harvested from their argument files with Python's ast by scripts/tools/harvest_megatron_flags.py "
                 "(names, argparse shapes, and literal defaults by source). Each flag lists the "
                 "sources that define it and each distinct shape with the sources that give it. "
                 "arguments/megatron/flag_classes.py and arguments/megatron/flags.py classify every option string.",
        "sources": described,
        "unavailable": unavailable,
        "flags": ordered,
    }


def write(data: dict, out: Path) -> None:
    """JSON with one line per flag, so a refresh shows as a readable diff."""
    lines = ["{"]
    for key in ("about", "sources", "unavailable"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(data[key], indent=2).replace(chr(10), chr(10) + '  ')},")
    lines.append('  "flags": {')
    items = list(data["flags"].items())
    for i, (option, entry) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"    {json.dumps(option)}: {json.dumps(entry, sort_keys=True)}{comma}")
    lines += ["  }", "}"]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", nargs=5, action="append", required=True,
                        metavar=("LABEL", "OWNER/NAME", "GIT_DIR", "REV", "PATH"))
    parser.add_argument("--unavailable", action="append", default=[], metavar="TEXT",
                        help="a source that could not be read, and why (kept in the data file)")
    parser.add_argument("--out", type=Path, default=REPO / "arguments" / "megatron" / "flags_harvested.json")
    args = parser.parse_args(argv)
    data = harvest(args.source, args.unavailable)
    write(data, args.out)
    for source in data["sources"]:
        print(f"{source['label']}: {source['repository']} {source['path']} @ {source['commit'][:10]} "
              f"({source['date']}): {source['option_strings']} option strings"
              + (f", {len(source['not_read'])} not read" if source["not_read"] else ""))
    print(f"{len(data['flags'])} distinct option strings -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
