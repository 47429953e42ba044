"""`--init-from-hf DIR`: the Hugging Face folder is the model, as `from_pretrained` and Megatron-Bridge take it. The
folder is a layer of settings between the preset and the JSON and command line: its architecture from config.json and
its tokenizer from the files beside it. A typed setting must equal the folder's."""

from __future__ import annotations

import filecmp
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from arguments.hf_config import CONFIG_FILE, HFConfig, read_hf_config, registered_family
from arguments.hf_dropout import folder_dropouts
from arguments.hf_training_choices import folder_training_choices
from data import DataError
from data.sentencepiece_tokenizer import SENTENCEPIECE_TYPES
from data.tokenizer import MERGES_FILE, MIN_VOCAB_SIZE, TOKENIZER_FILE, VOCAB_FILE, load_tokenizer
from families.common.fields import PLAIN_BLOCKS
from families.common.reader import FolderValue
from families.registry import family_readers

TOKENIZER_SETTINGS = ("tokenizer_type", "tokenizer_file", "vocab_file", "merge_file")


def architecture_settings(config: HFConfig) -> dict[str, FolderValue]:
    """The folder's ModelConfig settings by field name; a config.json our blocks cannot compute is refused in one line
    naming each key."""
    family = registered_family(config.family)
    if family is not None:  # a dense family
        return family.read(config)
    settings = family_readers()[config.family].settings(config)
    plain = {name: FolderValue(value, f"model_type {config.family}") for name, value in PLAIN_BLOCKS.items()}
    return {**plain, **settings, "hf_model_type": FolderValue(config.family, "model_type")}


@dataclass
class FolderLayer:
    """What the folder sets; `problems` are the launch's settings that disagree with it, one line each."""
    folder: Path
    config: HFConfig
    values: dict[str, tuple[Any, str, str]]  # setting -> (value, origin, note)
    problems: list[str]
    agreeing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # said once at start-up


def folder_layer(folder: str | os.PathLike, settings: dict[str, Any], explicit: dict[str, str],
                 as_flag: Callable[[str, Any], str]) -> FolderLayer:
    """The settings the folder gives over `settings` (all layers merged). `explicit` holds the settings typed on the
    command line or in the JSON, as given, which must equal the folder's; `as_flag(setting, value)` writes a value as
    its flag."""
    folder = Path(folder)
    config = read_hf_config(folder)
    where = f"{folder / CONFIG_FILE}"
    layer = FolderLayer(folder, config, {}, [])
    # rotary positions have no table: all but GPT-2 may train a longer context
    may_change = () if config.family == "gpt2" else ("max_position_embeddings",)

    def offer(name: str, value: Any, origin: str, note: str = "") -> None:
        if name in explicit and name in may_change:
            return
        if name in explicit:
            if settings[name] != value:
                layer.problems.append(f"{explicit[name]} disagrees with the folder's {as_flag(name, value)} "
                                      f"({origin}): the folder is the model; drop the flag")
            else:
                layer.agreeing[name] = origin
            return
        layer.values[name] = (value, origin, note)

    for name, given in architecture_settings(config).items():
        offer(name, given.value, f"{where}: {given.key}")
    dropouts, dropout_notes = folder_dropouts(config)
    choices, choice_notes = folder_training_choices(config)
    for name, given in {**dropouts, **choices}.items():  # a training choice: a flag that differs wins, said
        origin = f"{where}: {given.key}"
        if name in explicit and settings[name] != given.value:
            layer.notes.append(f"> {explicit[name]} overrides the folder's {as_flag(name, given.value)} ({origin}): "
                               f"the run trains with the flag's, and an export writes it")
        else:
            offer(name, given.value, origin)
    layer.notes += dropout_notes + choice_notes
    seq_length, positions = settings["seq_length"], config.max_position_embeddings
    if "max_position_embeddings" in explicit and "max_position_embeddings" in may_change:
        positions = settings["max_position_embeddings"]
    elif "seq_length" not in explicit and seq_length > positions:
        key = "n_positions" if config.family == "gpt2" else "max_position_embeddings"
        layer.values["seq_length"] = (positions, f"{where}: {key}",
                                      f"capped: {seq_length}, of the preset or the default, is longer than the "
                                      f"folder's positions")
    _tokenizer(layer, settings, explicit)
    registered = registered_family(config.family)
    family = registered.architecture if registered is not None else family_readers()[config.family].architectures[0]
    layer.notes[:0] = list(config.notes)
    layer.notes.insert(0, f"> the model is {folder}'s {family} ({config.num_layers} layers, hidden "
                          f"{config.hidden_size}, vocabulary {config.vocab_size}; --print-config names each key)")
    if registered is not None and registered.section is not None:
        layer.notes.insert(1, f"> {folder}'s {family} is read by its {registered.section}: its language model is the "
                              f"model here; the other models beside it (a vision tower, a projector) are not read")
    return layer


def folder_tokenizer(folder: Path) -> dict[str, Path]:
    """The folder's tokenizer files by setting: tokenizer.json, else vocab.json and merges.txt, else none."""
    if (folder / TOKENIZER_FILE).is_file():
        return {"tokenizer_file": folder / TOKENIZER_FILE}
    if (folder / VOCAB_FILE).is_file() and (folder / MERGES_FILE).is_file():
        return {"vocab_file": folder / VOCAB_FILE, "merge_file": folder / MERGES_FILE}
    return {}


def _tokenizer(layer: FolderLayer, settings: dict[str, Any], explicit: dict[str, str]) -> None:
    """The run's tokenizer beside the folder: an explicit one wins (Megatron-LM reads only its tokenizer flags), else
    the folder's, else the embedded corpus's BPE trained to fit. Its ids must fit the folder's vocab_size; the start-up
    line says which it is."""
    folder, vocab = layer.folder, layer.config.vocab_size
    where = f"{folder / CONFIG_FILE}: vocab_size"
    files = folder_tokenizer(folder)
    named = [name for name in TOKENIZER_SETTINGS if name in explicit and settings[name]]
    given_files = [name for name in ("tokenizer_file", "vocab_file", "merge_file") if name in named]
    if settings["tokenizer_type"] == "NullTokenizer" and ("tokenizer_type" in explicit or not files):
        _null_tokenizer(layer, settings, explicit, files)
        return
    if given_files or (named and not files):
        if settings["tokenizer_type"] not in SENTENCEPIECE_TYPES:
            _check_fits(layer, settings)
        if not given_files:
            return  # DataConfig.validate names the missing files
        paths = ", ".join(str(settings[name]) for name in given_files)
        if files and not all(_same_tokenizer(settings[name], folder, files.get(name)) for name in given_files):
            layer.notes.append(f"> the tokenizer is the one given ({paths}), not the folder's "
                               f"({', '.join(map(str, files.values()))}): its ids index {where} {vocab}'s rows")
        return
    if files:
        for name in ("tokenizer_file", "vocab_file", "merge_file"):
            if name in files:
                layer.values[name] = (str(files[name]), str(files[name]), "the folder's tokenizer")
            elif settings[name] and name not in explicit:
                layer.values[name] = (None, str(folder), "the folder's tokenizer is another file")
        _check_fits(layer, {name: str(path) for name, path in files.items()})
        layer.notes.append(f"> the tokenizer is the folder's: {', '.join(map(str, files.values()))}")
        return
    if settings["data_path"] or any(settings.get(name) for name in ("data_args_path", "per_split_data_args_path",
                                                                      "data_file_list")) \
            or any(settings.get(name) is not None for name in ("train_data_path", "valid_data_path", "test_data_path")):
        return  # DataConfig.validate asks for the data's tokenizer
    if vocab < MIN_TOKENIZER_VOCAB:
        layer.problems.append(f"{folder} has no tokenizer (tokenizer.json, or vocab.json and merges.txt) and "
                              f"{where} {vocab} is too small for the embedded corpus's byte-level BPE (at least "
                              f"{MIN_TOKENIZER_VOCAB}): give --tokenizer-file, or --data-path with --tokenizer-type "
                              f"NullTokenizer")
    elif "tokenizer_vocab_size" in explicit:
        if settings["tokenizer_vocab_size"] > vocab:
            layer.problems.append(f"{explicit['tokenizer_vocab_size']} is more than {where} {vocab}: the embedded "
                                  f"corpus's tokenizer must fit the model's vocabulary")
    else:
        layer.values["tokenizer_vocab_size"] = (vocab, where, f"{folder} has no tokenizer: the embedded corpus's "
                                                              f"byte-level BPE is trained to fit the model")
        layer.notes.append(f"> {folder} has no tokenizer: the embedded corpus's byte-level BPE is trained with at "
                           f"most its vocab_size, {vocab} tokens (give --tokenizer-file to use another)")


def _null_tokenizer(layer: FolderLayer, settings: dict[str, Any], explicit: dict[str, str],
                    files: dict[str, Path]) -> None:
    """NullTokenizer takes the data's ids as they are plus an end-of-document id --vocab-size, so it needs --vocab-size
    + 1 of the folder's rows; without --vocab-size its ids fill them."""
    folder, vocab = layer.folder, layer.config.vocab_size
    where = f"{folder / CONFIG_FILE}: vocab_size"
    if "vocab_size" in explicit:
        size, given = settings["vocab_size"], explicit["vocab_size"]
        if size + 1 > vocab:
            layer.problems.append(f"{given} with --tokenizer-type NullTokenizer makes {size + 1} token ids (the "
                                  f"end-of-document id is {size}), more than {where} {vocab}: give --vocab-size at "
                                  f"most {vocab - 1}")
            return
    else:
        size, given = vocab - 1, f"--vocab-size {vocab - 1}, {where} less the end-of-document id"
        layer.values["vocab_size"] = (size, where, f"less NullTokenizer's end-of-document id, {size}")
    instead = f", not the folder's {', '.join(p.name for p in files.values())}" if files else ""
    layer.notes.append(f"> the tokenizer is --tokenizer-type NullTokenizer ({given}){instead}: ids 0-{size - 1} as "
                       f"the data holds them and the end-of-document id {size}, within the folder's {vocab} rows")


def _check_fits(layer: FolderLayer, named: dict[str, Any]) -> None:
    """The tokenizer in `named` has no id past the folder's vocabulary, checked before the data is prepared; a missing
    file is left to the input checks."""
    paths = [named.get(name) for name in ("tokenizer_file", "vocab_file", "merge_file") if named.get(name)]
    if not paths or not all(os.path.exists(path) for path in paths):
        return
    try:
        size = load_tokenizer(tokenizer_file=named.get("tokenizer_file"), vocab_file=named.get("vocab_file"),
                              merges_file=named.get("merge_file")).vocab_size
    except DataError as error:
        layer.problems.append(f"{', '.join(paths)}: the tokenizer cannot be read ({error})")
        return
    if size > layer.config.vocab_size:
        layer.problems.append(f"the tokenizer {', '.join(paths)} has {size} tokens, more than "
                              f"{layer.folder / CONFIG_FILE}: vocab_size {layer.config.vocab_size}; the ids past it "
                              f"have no row in the model")


# --tokenizer-vocab-size's floor (DataConfig.validate)
MIN_TOKENIZER_VOCAB = max(300, MIN_VOCAB_SIZE)


def _same_tokenizer(given: str, folder: Path, theirs: Optional[Path]) -> bool:
    """`given` is the folder's tokenizer: the folder, a file in it, or a file with the same content."""
    path = Path(given)
    try:
        if path.resolve() == folder.resolve() or path.resolve().parent == folder.resolve():
            return True
        return theirs is not None and path.is_file() and filecmp.cmp(path, theirs, shallow=False)
    except OSError:
        return False

