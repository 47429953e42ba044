"""Acceptance: the replay corpus (tests/replay_corpus/) of real launch scripts and DeepSpeed JSONs.

Each launch goes through the one shrink (tests/replay_corpus/shrink.py: tiny sizes, local paths, every
other flag and JSON key as written) and runs `pretrain_gpt.main` on 2 CPU ranks (gloo); one that names a
SentencePiece tokenizer type gets the embedded corpus tokenized with a SentencePiece model trained on it
(tests/conftest.py). Its `outcome` is the target:

- "trains": both ranks (all 4 where shrink.ranks_for says so) exit 0, and the metrics file's last training
  record is iteration 3, every loss finite. Each such launch gets its own processes. Of the Megatron-MoE-ModelZoo
  launches only megatron_moe_modelzoo.TRAINED_HERE train in the suite, of ROCm/Megatron-LM's only
  rocm_megatron_lm.TRAINED_HERE (the others: the shrink's and --print-config's checks, which parse them whole).
  A launch whose shrunk settings equal another's (same_settings.SAME_SETTINGS: 85 of 298, mostly Megatron-LM's
  functional-test variants) trains as that one: pretrain_gpt.main runs from the parsed settings alone, so the two
  runs would be one run twice (0.6-25 s of the 2-core machine each); the check here parses both again each time.
- "refused: TEXT": both ranks exit 2 and rank 0 prints exactly one line on stderr, containing TEXT and
  not "unrecognized arguments" (a refusal is for a feature this program knows and does not have; a flag
  it does not know is a failure to accept the script). These launches share one pair of processes, one
  after the other: a refusal comes before any collective, so they cannot hang each other, and sharing
  saves a second of imports per launch.

KNOWN_FAILING_TODAY lists the launches that miss their target on this branch, with the cause. They are
strict xfails: the fix that makes one pass must delete its entry here, so the list only shrinks. The
outcomes themselves are the target and do not move to match the code.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from arguments.parser import parse_arguments
from base.options import setting_values
from tests.distributed import run_distributed
from tests.replay_corpus import CORPUS, HARVESTED
from tests.replay_corpus.launch import Launch
from tests.replay_corpus.megatron_lm_functional_tests import HARVESTED as EVERY_FUNCTIONAL_TEST
from tests.replay_corpus.megatron_lm_functional_tests import MOE_HARVESTED as EVERY_MOE_FUNCTIONAL_TEST
from tests.replay_corpus.megatron_moe_modelzoo import LAUNCHES as MODELZOO
from tests.replay_corpus.megatron_moe_modelzoo import TRAINED_HERE as MODELZOO_TRAINED_HERE
from tests.replay_corpus.rocm_megatron_lm import LAUNCHES as ROCM
from tests.replay_corpus.rocm_megatron_lm import TRAINED_HERE as ROCM_TRAINED_HERE
from tests.replay_corpus.same_settings import SAME_SETTINGS
from tests.replay_corpus.shrink import (
    CHANGED_FLAGS,
    CHANGED_JSON_KEYS,
    ITERATIONS,
    SHORTENED_LISTS,
    WORLD_SIZE,
    LocalFiles,
    Shrunk,
    ranks_for,
    shrink,
    split_flags,
    uses_sentencepiece,
)
from tests.replay_rank import replay_all_on_rank, replay_on_rank

# Why each launch misses its target today, first error first ("then": what the next error would be once
# the first is fixed, found by dropping the offending flags or keys by hand).
_TENSORBOARD_LOGGING = "--tensorboard-queue-size, --log-{timers,batch-size,validation-ppl}-to-tensorboard"
_PATCH_FLAG = ("its refusal now comes with the launch's other problems (an invalid choice no longer ends the parse), "
               "and among them {flag}, {program}'s own flag, is an unrecognized argument: its flags are not harvested")
KNOWN_FAILING_TODAY: dict[str, str] = {
    **{f"ling-2.0-mini-pretrain-{length}": _PATCH_FLAG.format(flag="--bias-zero-mean-update",
                                                             program="inclusionAI's Megatron-LM patch")
       for length in ("4k", "8k", "32k")},
    "opengptx-teuken-7b-part3": _PATCH_FLAG.format(flag="--t5-swiglu", program="OpenGPT-X's Megatron-LM fork"),
    "zyphra-moe-1.3b-8e-megarun": _PATCH_FLAG.format(flag="--hf_autotokenizer_model", program="Zyphra's Megatron-LM fork"),
}


def _params(launches):
    for launch in launches:
        marks = []
        if launch.name in KNOWN_FAILING_TODAY:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILING_TODAY[launch.name]))
        yield pytest.param(launch, id=launch.name, marks=marks)


# Every launch is replayed: the listed corpus and Megatron-LM's functional tests harvested whole.
REPLAYED = (*CORPUS, *HARVESTED)
TRAINS = [launch for launch in REPLAYED if launch.refusal is None]
_PARSED_ONLY = ({launch.name for launch in MODELZOO} - MODELZOO_TRAINED_HERE) | \
    ({launch.name for launch in ROCM} - ROCM_TRAINED_HERE)
TRAINING = [launch for launch in TRAINS if launch.name not in _PARSED_ONLY]
TRAINED_AS_ANOTHER = [launch for launch in TRAINING if launch.name in SAME_SETTINGS]
TRAINED_ALONE = [launch for launch in TRAINING if launch.name not in SAME_SETTINGS]
REFUSED = [launch for launch in REPLAYED if launch.refusal is not None]


@pytest.fixture(scope="module")
def prepared(embedded_corpus):
    """One corpus and tokenizer: Megatron .bin/.idx data and a GPT-2-format tokenizer."""
    return embedded_corpus[1]


def corpus_for(launch: Launch, prepared, request):
    """The launch's local corpus: for one naming a SentencePiece type, the embedded corpus tokenized with a
    SentencePiece model (tests/conftest.py's, prepared once a session and only when such a launch runs)."""
    return request.getfixturevalue("sentencepiece_corpus") if uses_sentencepiece(launch) else prepared


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def shrunk_into(launch: Launch, prepared, out_dir: Path) -> Shrunk:
    """The launch made small, its files (the JSON, split lists) written under out_dir."""
    shrunk = shrink(launch, LocalFiles(prepared.data_prefix, prepared.tokenizer_dir, prepared.vocab_size,
                                       str(out_dir)))
    for path, text in shrunk.files.items():
        Path(path).write_text(text)
    return shrunk


def shrunk_argv(launch: Launch, prepared, out_dir: Path) -> list[str]:
    """The shrunk launch's command line, its metrics in out_dir/metrics.jsonl."""
    return shrunk_into(launch, prepared, out_dir).argv + ["--metrics-file", str(out_dir / "metrics.jsonl")]


def stderr_of_rank0(out_dir: Path) -> str:
    return (out_dir / "rank0.err").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("launch", list(_params(TRAINED_ALONE)))
def test_launch_trains(launch: Launch, prepared, tmp_path, request):
    ranks = ranks_for(launch)
    status = run_distributed(replay_on_rank, ranks, shrunk_argv(launch, corpus_for(launch, prepared, request),
                                                                tmp_path), str(tmp_path),
                             timeout=180)
    assert status == [0] * ranks, f"{launch.name} did not train: {stderr_of_rank0(tmp_path).strip()[-3000:]}"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    training = [record for record in records if "split" not in record]
    assert training and training[-1]["iteration"] == ITERATIONS, training
    assert all(math.isfinite(record["loss"]) for record in training), training


def trained_settings(launch: Launch, prepared, out_dir: Path) -> tuple:
    """What a trained launch's run follows from: its ranks, its tokenizer kind, every setting the parse gives
    (values; not where each came from), and the text of the files the shrink writes that the settings only name
    (split lists; a DeepSpeed JSON's content is in the settings)."""
    shrunk = shrunk_into(launch, prepared, out_dir)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        config = parse_arguments(shrunk.argv).config
    return (ranks_for(launch), uses_sentencepiece(launch),
            {path: text for path, text in shrunk.files.items() if not path.endswith(".json")},
            {section: setting_values(getattr(config, section)) for section in config.SECTIONS})


@pytest.mark.parametrize("launch", TRAINED_AS_ANOTHER, ids=[launch.name for launch in TRAINED_AS_ANOTHER])
def test_a_launch_trained_as_another_has_its_settings(launch: Launch, prepared, tmp_path):
    """same_settings.SAME_SETTINGS: the launch parses, shrunk into the same folder, to the settings of the one that
    trains for it, which does train here. When this fails, delete the launch's line there: it trains on its own."""
    other = next(trained for trained in TRAINED_ALONE if trained.name == SAME_SETTINGS[launch.name])
    assert launch.name not in KNOWN_FAILING_TODAY and other.name not in KNOWN_FAILING_TODAY
    assert trained_settings(launch, prepared, tmp_path) == trained_settings(other, prepared, tmp_path)


# Megatron CI's ckpt-resume phase on real configs: one that trains today (PP 2, --save and --load one folder),
# the gpt3_mcore_reruns_resume config the issue names (--save and --load two folders, as its CI passes), and
# Megatron-LM's MoE Muon one with the distributed optimizer (EP 8 shrunk to 2, ZeRO 1: Muon's momentum resumed
# from a partition cut over the expert and dense data-parallel groups).
CKPT_RESUME = [pytest.param(launch, id=launch.name, marks=[pytest.mark.xfail(
    strict=True, reason=KNOWN_FAILING_TODAY[launch.name])] if launch.name in KNOWN_FAILING_TODAY else [])
    for launch in REPLAYED if launch.name in ("megatron-lm-functional-tp1-pp2",
                                              "megatron-lm-functional-mcore-reruns-resume",
                                              "megatron-lm-ft-moe-gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon")]


@pytest.mark.slow
@pytest.mark.parametrize("launch", CKPT_RESUME)
def test_megatron_ckpt_resume_phase_resumes(launch: Launch, prepared, tmp_path):
    """Megatron-LM's tests/functional_tests/shell_test_utils/run_ci_test.sh (at 0980313c), TEST_TYPE
    ckpt-resume: train; `rm -rf $CHECKPOINT_LOAD_PATH/iter_$TRAIN_ITERS`; write an earlier iteration into
    $CHECKPOINT_LOAD_PATH/latest_checkpointed_iteration.txt; train again with CHECKPOINT_LOAD_PATH set to
    the save folder. Shrunk, the run is 3 iterations saved at 2 and 3 (--save-interval 2), so the earlier
    iteration is 2 (the script's TRAIN_ITERS / 2 is an iteration its configs save at). The second run must
    load iteration 2 and log iteration 3 with the first run's loss."""
    argv = shrunk_argv(launch, prepared, tmp_path)
    save = argv[argv.index("--save") + 1]
    status = run_distributed(replay_on_rank, WORLD_SIZE, argv, str(tmp_path), timeout=180)
    assert status == [0, 0], f"{launch.name}: {stderr_of_rank0(tmp_path).strip()[-3000:]}"
    first = {record["iteration"]: record["loss"] for record in
             (json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
             if "split" not in record and "loss" in record}
    shutil.rmtree(Path(save) / f"iter_{ITERATIONS:07d}")
    (Path(save) / "latest_checkpointed_iteration.txt").write_text(f"{ITERATIONS - 1}\n")
    again = tmp_path / "phase2"
    again.mkdir()
    argv = list(argv)
    argv[argv.index("--load") + 1] = save
    argv[argv.index("--metrics-file") + 1] = str(again / "metrics.jsonl")
    status = run_distributed(replay_on_rank, WORLD_SIZE, argv, str(again), timeout=180)
    assert status == [0, 0], f"{launch.name}: {stderr_of_rank0(again).strip()[-3000:]}"
    # our format's "loading iter_0000002 ..." or, with --ckpt-format torch_dist, Megatron's folder; either way:
    assert "iter_0000002: resuming after iteration 2" in (again / "rank0.out").read_text()
    second = {record["iteration"]: record["loss"] for record in
              (json.loads(line) for line in (again / "metrics.jsonl").read_text().splitlines())
              if "split" not in record and "loss" in record}
    assert sorted(second) == [ITERATIONS] and second[ITERATIONS] == first[ITERATIONS], (first, second)


@pytest.fixture(scope="module")
def refusals(prepared, tmp_path_factory) -> dict[str, tuple[list[int], str]]:
    """{name: (exit status per rank, rank 0's stderr)} of every launch whose target is a refusal."""
    base = tmp_path_factory.mktemp("refusals")
    jobs = []
    for launch in REFUSED:
        out_dir = base / launch.name
        out_dir.mkdir()
        jobs.append((shrunk_argv(launch, prepared, out_dir), str(out_dir)))
    per_rank = run_distributed(replay_all_on_rank, WORLD_SIZE, jobs, timeout=300)
    return {launch.name: ([statuses[i] for statuses in per_rank], stderr_of_rank0(base / launch.name))
            for i, launch in enumerate(REFUSED)}


@pytest.mark.slow
@pytest.mark.parametrize("launch", list(_params(REFUSED)))
def test_launch_is_refused_in_one_line(launch: Launch, refusals):
    status, err = refusals[launch.name]
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == [2, 2], f"{launch.name}: exit {status}, expected a refusal: {err.strip()[-3000:]}"
    assert len(lines) == 1, lines
    assert launch.refusal in lines[0], lines[0]
    assert "unrecognized arguments" not in lines[0], lines[0]


def test_corpus_spans_the_sources_the_issue_names():
    """At least 15 scripts and 15 JSONs from at least 4 repositories, each with its source and commit."""
    scripts = [launch for launch in CORPUS if launch.script]
    jsons = {launch.json_text for launch in CORPUS if launch.json_text}
    repos = {launch.script.repo for launch in scripts} | {launch.json.repo for launch in CORPUS if launch.json}
    assert len(scripts) >= 15 and len(jsons) >= 15 and len(repos) >= 4
    assert len({launch.name for launch in CORPUS}) == len(CORPUS)
    assert len({launch.name for launch in REPLAYED}) == len(REPLAYED)
    assert set(KNOWN_FAILING_TODAY) <= {launch.name for launch in REPLAYED}
    for launch in REPLAYED:
        assert launch.outcome == "trains" or launch.refusal, launch.name
        for source in (launch.script, launch.json):
            assert source is None or len(source.commit) == 40, launch.name
        if launch.json_text:
            json.loads(launch.json_text)


def _shrunk_offline(launch: Launch):
    files = LocalFiles("/data/corpus_text_document", "/tokenizer", 512, "/out")
    return files, shrink(launch, files)


def _leaves(value, prefix=""):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), value


@pytest.mark.parametrize("launch", REPLAYED, ids=[launch.name for launch in REPLAYED])
def test_shrink_changes_only_sizes_and_paths(launch: Launch):
    """Every flag stays, in its place, with its values unless it is a size, count, interval or path; the
    JSON keeps every key, and every value but the batch keys and steps_per_print."""
    files, shrunk = _shrunk_offline(launch)
    before, after = split_flags(launch.argv), split_flags(shrunk.argv)
    assert [flag for flag, _, _ in after] == [flag for flag, _, _ in before] + shrunk.added
    assert set(shrunk.added) <= {"--vocab-file", "--merge-file", "--eval-iters"}  # shrink.py's docstring
    for (flag, values, inline), (_, new_values, new_inline) in zip(before, after):
        assert inline == new_inline and (len(new_values) == len(values) or flag in SHORTENED_LISTS), flag
        if flag not in CHANGED_FLAGS:
            assert new_values == values, flag
    if launch.json_text is not None:
        (json_path,) = [path for path in shrunk.files if path.endswith(".json")]
        old, new = dict(_leaves(json.loads(launch.json_text))), dict(_leaves(json.loads(shrunk.files[json_path])))
        assert list(new) == list(old)
        assert {key for key in old if old[key] != new[key]} <= CHANGED_JSON_KEYS


def _agreements(launch: Launch, argv, json_text, data_parallel: int) -> dict[str, bool]:
    """Which of the script's batch and interval numbers agree with its JSON's, as DeepSpeed reads them."""
    flags = {flag: values for flag, values, _ in split_flags(argv)}
    config = json.loads(json_text) if json_text else {}
    micro = next((int(flags[f][0]) for f in ("--micro-batch-size", "--batch-size") if f in flags), None)
    found = {}
    if micro and "train_batch_size" in config:
        accumulation = config.get("gradient_accumulation_steps")
        json_micro = config.get("train_micro_batch_size_per_gpu") or \
            config["train_batch_size"] // ((accumulation or 1) * data_parallel)
        found["micro batch"] = json_micro == micro
    if "--global-batch-size" in flags and "train_batch_size" in config:
        found["global batch"] = int(flags["--global-batch-size"][0]) == config["train_batch_size"]
    if "--log-interval" in flags and "steps_per_print" in config:
        found["log interval"] = int(flags["--log-interval"][0]) == config["steps_per_print"]
    return found


@pytest.mark.parametrize("launch", [launch for launch in CORPUS if launch.json_text and launch.script],
                         ids=lambda launch: launch.name)
def test_shrink_keeps_agreements_and_contradictions(launch: Launch):
    """A script and its JSON that agreed still agree after the shrink; those that contradicted each other
    still do (the code under test must accept the pair as the real one did, not the shrink)."""
    _, shrunk = _shrunk_offline(launch)
    flags = {flag: values for flag, values, _ in split_flags(launch.argv)}
    tp = next((int(flags[f][0]) for f in ("--tensor-model-parallel-size", "--model-parallel-size") if f in flags), 1)
    pp = next((int(flags[f][0]) for f in ("--pipeline-model-parallel-size", "--pipe-parallel-size") if f in flags), 1)
    json_path = next(path for path in shrunk.files if path.endswith(".json"))
    assert _agreements(launch, launch.argv, launch.json_text, max(1, launch.world_size // (tp * pp))) == \
        _agreements(launch, shrunk.argv, shrunk.files[json_path],
                    max(1, WORLD_SIZE // (min(tp, WORLD_SIZE // min(pp, WORLD_SIZE)) * min(pp, WORLD_SIZE))))


def test_a_contradiction_survives_the_shrink():
    """DeepSpeedExamples' ds_pretrain_gpt2.sh: --batch-size 8 on one GPU beside train_batch_size 16 and
    accumulation 1 (DeepSpeed's micro batch 16): still two different micro batches after the shrink."""
    (launch,) = [launch for launch in CORPUS if launch.name == "deepspeedexamples-ds-pretrain-gpt2"]
    _, shrunk = _shrunk_offline(launch)
    flags = {flag: values for flag, values, _ in split_flags(shrunk.argv)}
    config = json.loads(next(text for path, text in shrunk.files.items() if path.endswith(".json")))
    assert flags["--batch-size"] == ["2"] and config["train_batch_size"] == 3 * 1 * WORLD_SIZE


def test_a_zero_warmup_stays_zero_through_the_shrink():
    """The gpt3_mcore_reruns_* configs' `--lr-warmup-samples: 0` (no warmup; Megatron's default, which its
    validate_args requires beside --train-iters) stays 0: before, "at least 1" made it a one-sample
    warmup, a flag the config never gave and one Megatron would refuse."""
    (launch,) = [launch for launch in CORPUS if launch.name == "megatron-lm-functional-mcore-reruns-resume"]
    _, shrunk = _shrunk_offline(launch)
    flags = {flag: values for flag, values, _ in split_flags(shrunk.argv)}
    assert flags["--lr-warmup-samples"] == ["0"] and flags["--train-iters"] == [str(ITERATIONS)]


def megatron_train_iters(train_samples: int, global_batch: int, ramp) -> int:
    """Megatron-LM's update_train_iters (megatron/training/training.py at fa0dcc48) with its
    RampupBatchsizeNumMicroBatchesCalculator: the iterations a --train-samples run takes."""
    if ramp is None:
        return train_samples // global_batch
    start, increment, ramp_samples = ramp
    per_increment = ramp_samples / ((global_batch - start) // increment)
    iterations = consumed = 0
    while consumed <= ramp_samples and consumed <= train_samples:
        consumed += global_batch if consumed > ramp_samples else start + int(consumed / per_increment) * increment
        iterations += 1
    if train_samples > consumed:
        iterations += (train_samples - consumed) // global_batch
    return iterations


@pytest.mark.parametrize("launch", [launch for launch in CORPUS if "--train-samples" in launch.argv],
                         ids=lambda launch: launch.name)
def test_shrunk_sample_length_is_three_iterations_in_megatron(launch: Launch):
    _, shrunk = _shrunk_offline(launch)
    flags = {flag: values for flag, values, _ in split_flags(shrunk.argv)}
    ramp = tuple(int(v) for v in flags["--rampup-batch-size"]) if "--rampup-batch-size" in flags else None
    assert megatron_train_iters(int(flags["--train-samples"][0]), int(flags["--global-batch-size"][0]), ramp) == \
        ITERATIONS
    if "--train-tokens" in flags:
        assert int(flags["--train-tokens"][0]) == int(flags["--train-samples"][0]) * int(flags["--seq-length"][0])


def test_the_docs_list_the_corpus_and_its_outcomes():
    """The table in docs/coming-from-megatron-deepspeed.md: one row per launch, its outcome, and "yes"
    under today exactly when the launch is not in KNOWN_FAILING_TODAY (so a fix updates both)."""
    from tests.readme import doc_section

    table = doc_section("docs/coming-from-megatron-deepspeed.md", "The replay corpus")
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].strip("`")] = cells
    assert set(rows) == {launch.name for launch in CORPUS}
    for launch in CORPUS:
        _, script, _, outcome, today = rows[launch.name]
        assert outcome == launch.outcome, launch.name
        assert today == ("not yet" if launch.name in KNOWN_FAILING_TODAY else "yes"), launch.name
        assert (launch.script.path if launch.script else "SIMPLE_LAUNCH") in script, launch.name


# Launches of KNOWN_FAILING_TODAY whose flags themselves are still refused, so --print-config refuses them too,
# with KNOWN_FAILING_TODAY's cause.
FLAGS_REFUSED_TODAY: dict[str, str] = {}


@pytest.mark.parametrize("launch", [pytest.param(launch, id=launch.name, marks=[
    pytest.mark.xfail(strict=True, reason=FLAGS_REFUSED_TODAY[launch.name])] if launch.name in FLAGS_REFUSED_TODAY
    else []) for launch in TRAINS])
def test_print_config_names_every_flag_and_json_key_of_a_launch(launch: Launch, tmp_path):
    """Issue 22: --print-config on a corpus launch shows every flag and JSON key it was given, each
    beside what it does here (a setting's source, a Megatron flag's class and reason, a JSON key's
    verdict), and, where the JSON and the command line set one thing differently, which side won."""
    from arguments.parser import parse_arguments
    from arguments.print_config import format_config

    files = LocalFiles(str(tmp_path / "data" / "corpus_text_document"), str(tmp_path / "tokenizer"), 512,
                       str(tmp_path / "out"))
    shrunk = shrink(launch, files)
    for path, text in shrunk.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    text = format_config(parse_arguments(shrunk.argv))
    missing = [flag for flag, _, _ in split_flags(shrunk.argv) if not re.search(re.escape(flag) + r"(?![\w-])", text)]
    assert missing == [], missing
    if launch.json_text is not None:
        keys = [key for key, _ in _leaves(json.loads(launch.json_text))]
        assert [key for key in keys if not re.search(r"(?<![\w.])" + re.escape(key.split(".")[0]) + r"\b", text)] == []
    for line in text.splitlines():
        if line.startswith("> warning:") and "set" in line and "differently" in line:
            assert " wins" in line, line


def _outcome_rows(section: str) -> dict[str, int]:
    """The `| outcome | configurations |` rows of a docs section; a `\\|` inside a cell is a `|` of the cell
    (GFM tables escape it so; the --pipeline-model-parallel-layout values hold pipes)."""
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if line.startswith("| ") and len(cells) == 2 and cells[1].isdigit():
            rows[cells[0]] = int(cells[1])
    return rows


@pytest.mark.parametrize(("title", "launches"), [
    ("Megatron-LM's functional tests, harvested whole", EVERY_FUNCTIONAL_TEST),
    ("Megatron-LM's MoE functional tests, harvested whole", EVERY_MOE_FUNCTIONAL_TEST)], ids=["gpt", "moe"])
def test_the_docs_count_megatrons_functional_tests_by_outcome(title, launches):
    """docs/coming-from-megatron-deepspeed.md's tables of Megatron-LM's GPT functional tests and of its MoE
    (test_cases/moe/*, test_cases/mixtral/*) pretraining functional tests, harvested whole: how many train, and
    how many are refused for each feature (the first refused flag), exactly as the corpus targets say; the ones
    replayed in the listed corpus count by their harvested outcome too."""
    import collections

    from tests.readme import doc_section

    section = doc_section("docs/coming-from-megatron-deepspeed.md", title)
    counts = collections.Counter("trains" if launch.refusal is None else launch.refusal.split(":")[0]
                                 for launch in launches)
    expected = {("trains" if outcome == "trains" else f"refused: `{outcome}`"): count
                for outcome, count in counts.items()}
    assert _outcome_rows(section) == expected
    prose = " ".join(section.split())
    broken = sum(launch.name in KNOWN_FAILING_TODAY for launch in launches)
    assert f"{len(launches)} configurations" in prose and f"{broken} broken" in prose


def _runs(pattern: list) -> list:
    """The pattern with each run of equal entries written once: [dense, MoE] for "[0]*3+[1]*58"."""
    return [entry for index, entry in enumerate(pattern) if index == 0 or pattern[index - 1] != entry]


def test_a_list_moe_layer_freq_shrinks_with_its_layers():
    """Megatron-LM's MoE functional tests and its Megatron-FSDP DeepSeek-V3 example give --moe-layer-freq as a
    list expression, one 0 (dense) or 1 (MoE) per layer ("[0]*3+[1]*58" beside --num-layers 61; Megatron-LM's
    moe_freq_type, and its validate_args asserts the list's length is num_layers): the shrink cuts the layers and
    the list together, each run of the list keeping at least one layer in its place (the dense-first pattern
    stays), so the launch is not refused for a length the shrink made; one whose
    --pipeline-model-parallel-layout places the layers keeps its layers and list as written."""
    from gpt.moe.settings import moe_layer_pattern

    launches = [launch for launch in REPLAYED if "[" in dict(
        (flag, values) for flag, values, _ in split_flags(launch.argv)).get("--moe-layer-freq", [""])[-1]]
    assert len(launches) >= 10
    shrunk_ones = 0
    for launch in launches:
        _, shrunk = _shrunk_offline(launch)
        before = {flag: values for flag, values, _ in split_flags(launch.argv)}
        after = {flag: values for flag, values, _ in split_flags(shrunk.argv)}
        layers = int(after["--num-layers"][-1])
        pattern = moe_layer_pattern(after["--moe-layer-freq"][-1], layers)
        assert len(pattern) == layers, launch.name
        original = moe_layer_pattern(before["--moe-layer-freq"][-1], int(before["--num-layers"][-1]))
        assert _runs(pattern) == _runs(original), launch.name
        if "--pipeline-model-parallel-layout" in before:
            assert after["--num-layers"] == before["--num-layers"], launch.name
            assert after["--moe-layer-freq"] == before["--moe-layer-freq"], launch.name
        else:
            shrunk_ones += layers < int(before["--num-layers"][-1])
    (example,) = [launch for launch in launches if launch.name == "megatron-lm-megatron-fsdp-deepseek-v3"]
    after = {flag: values for flag, values, _ in split_flags(_shrunk_offline(example)[1].argv)}
    assert after["--num-layers"] == ["2"] and after["--moe-layer-freq"] == ["[0]*1+[1]*1"]
    assert shrunk_ones >= 3


def test_the_shrink_keeps_the_expert_tensor_parallel_size_the_two_ranks_allow():
    """The experts' grid folds over the ranks of a stage (Megatron-Core's initialize_model_parallel takes any ETP x
    EP dividing them, parallel/mesh.py): the shrink keeps a given --expert-tensor-parallel-size where it divides the
    new stage's ranks, even above the new TP size, and cuts it (to their gcd) only where it does not; EP takes what
    is left, and the experts' width stays a multiple of the expert TP size. Megatron-LM's dense CP 2 x ETP 4
    launches (gpt3_mcore_te_tp2_pp2_cp2_etp4_*_1node: TP 1 x CP 2 on the 2 ranks) keep ETP 2; its PP 2 ones, whose
    stage is one rank, ETP 1."""
    def sizes(argv, names=("--tensor-model-parallel-size", "--context-parallel-size", "--expert-model-parallel-size",
                           "--expert-tensor-parallel-size", "--moe-ffn-hidden-size")):
        given = {flag: values for flag, values, _ in split_flags(argv)}
        return tuple(int(given[name][0]) if name in given else None for name in names)

    moe = ("--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "128",
           "--max-position-embeddings", "128", "--micro-batch-size", "1", "--global-batch-size", "8",
           "--num-experts", "8", "--moe-ffn-hidden-size", "72")
    for parallel, expected in ((("--tensor-model-parallel-size", "1", "--expert-tensor-parallel-size", "2",
                                 "--expert-model-parallel-size", "4"), (1, None, 1, 2, 10)),
                               (("--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                 "--expert-tensor-parallel-size", "4"), (1, 2, None, 2, 10)),
                               (("--tensor-model-parallel-size", "4", "--expert-tensor-parallel-size", "2",
                                 "--expert-model-parallel-size", "2"), (2, None, 1, 2, 10)),
                               (("--tensor-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
                                 "--expert-model-parallel-size", "8"), (1, None, 2, 1, 9))):
        launch = Launch(name="etp", script=None, program="pretrain_gpt.py", world_size=8, expanded="",
                        argv=moe + parallel, outcome="trains")
        assert sizes(_shrunk_offline(launch)[1].argv) == expected, parallel
    etp4 = [launch for launch in EVERY_FUNCTIONAL_TEST if "_cp2_etp4_" in launch.name]
    assert len(etp4) == 8
    for launch in etp4:
        stage_of_one = "--pipeline-model-parallel-size" in launch.argv and \
            launch.argv[launch.argv.index("--pipeline-model-parallel-size") + 1] != "1"
        assert sizes(_shrunk_offline(launch)[1].argv)[3] == (1 if stage_of_one else 2), launch.name
