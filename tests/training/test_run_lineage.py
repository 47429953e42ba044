"""Records and saves know their run; paths mean what they mean (issue 33, problems 1, 2, 6, 7 and 8).

Runs share folders: one metrics file, one save directory after --overwrite-save. Whatever a run
removes -- the records its resume redoes, the checkpoints --keep-last retires -- must be its own
lineage's (checkpoint/lineage.py). Each test reproduces a probe of the issue; each fails on the code
before it. The runs are `pretrain_gpt.main` in this process on a one-block model (about a second each).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import pretrain_gpt
from checkpoint.format import LATEST_FILE, METADATA_FILE
from tests.reliability_helpers import TINY, metrics_records, run_main, snapshot, write_dataset


def train(cache: str, metrics: Path, *extra):
    """The tiny model on the session's prepared corpus (512-token vocabulary), records to `metrics`."""
    return run_main(pretrain_gpt.main, TINY + ["--tokenizer-vocab-size", "512", "--data-cache-dir", cache,
                                               "--metrics-file", str(metrics), *map(str, extra)])


def saved_metadata(iteration_dir: Path) -> dict:
    return json.loads((iteration_dir / METADATA_FILE).read_text())


def no_work(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("data preparation started although the run should have been refused")

    monkeypatch.setattr("training.prepare.build_data", forbidden)


# ---- 1. a resume removes only its own redone records ------------------------------------------------

def test_a_resume_drops_only_its_own_lineages_redone_records(corpus_cache, tmp_path):
    """Problem 1: run A saved at iteration 2, an unrelated run C appended to the same metrics file, A
    resumed and cut the file back after its iteration 2 -- deleting C's records after iteration 2."""
    metrics = tmp_path / "metrics.jsonl"
    a, c = tmp_path / "a", tmp_path / "c"
    assert train(corpus_cache, metrics, "--save", a, "--train-iters", "3", "--save-interval", "2").code == 0
    (a / LATEST_FILE).write_text("iter_0000002\n")  # A was killed after its iteration-2 save
    assert train(corpus_cache, metrics, "--save", c, "--train-iters", "3").code == 0
    before = metrics_records(metrics)
    run_a, run_c = before[0]["run_id"], before[-1]["run_id"]
    assert run_a != run_c and saved_metadata(a / "iter_0000002")["run_id"] == run_a
    c_records = [r for r in before if r["run_id"] == run_c]
    assert [r["iteration"] for r in c_records] == [1, 2, 3]

    resumed = train(corpus_cache, metrics, "--save", a, "--load", a, "--train-iters", "3")
    assert resumed.code == 0, resumed.err
    assert "dropped 1 records after iteration 2" in resumed.out
    after = metrics_records(metrics)
    assert [r for r in after if r["run_id"] == run_c] == c_records  # nothing of C's is lost
    a_records = [r for r in after if r["run_id"] == run_a]
    assert [r["iteration"] for r in a_records] == [1, 2, 3]
    # The lineage is kept across the resume; the launch is new, in the records and in the save.
    assert a_records[0]["launch_id"] != a_records[2]["launch_id"]
    assert saved_metadata(a / "iter_0000003")["run_id"] == run_a
    assert saved_metadata(a / "iter_0000003")["launch_id"] == a_records[2]["launch_id"]


# ---- 2. --keep-last counts only the live lineage ---------------------------------------------------

def test_overwrite_save_with_keep_last_never_deletes_another_runs_saves(corpus_cache, tmp_path):
    """Problem 2: with --overwrite-save --keep-last, the old run's iter_3 (not same-numbered) was
    deleted, and the new run's own saves were counted against the old run's newer ones."""
    metrics, ck = tmp_path / "metrics.jsonl", tmp_path / "ck"
    assert train(corpus_cache, metrics, "--save", ck, "--train-iters", "6", "--save-interval", "3").code == 0
    old = {name: snapshot(ck / name) for name in ("iter_0000003", "iter_0000006")}
    outcome = train(corpus_cache, metrics, "--save", ck, "--overwrite-save", "--keep-last", "1",
                    "--train-iters", "4", "--save-interval", "2")
    assert outcome.code == 0, outcome.err
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("iter_")) == [
        "iter_0000003", "iter_0000004", "iter_0000006"]
    assert {name: snapshot(ck / name) for name in old} == old  # the old run's saves, byte for byte
    assert (ck / LATEST_FILE).read_text().strip() == "iter_0000004"
    assert saved_metadata(ck / "iter_0000004")["run_id"] != saved_metadata(ck / "iter_0000006")["run_id"]


# ---- 6. no output inside a checkpoint -----------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_run(embedded_corpus, tmp_path_factory):
    """A save directory with iter_0000001 and iter_0000002 (read-only for the tests)."""
    work = tmp_path_factory.mktemp("lineage-saved")
    outcome = train(embedded_corpus[0], work / "metrics.jsonl", "--save", work / "ck", "--save-interval", "1")
    assert outcome.code == 0, outcome.err
    return work / "ck"


@pytest.mark.parametrize("flag, where", [
    ("--save", "iter_0000001"), ("--save", "iter_0000001/deeper"), ("--save", "nested"),
    ("--metrics-file", "iter_0000001/m.jsonl"), ("--tensorboard-dir", "iter_0000001/tb")])
def test_an_output_inside_a_checkpoint_is_refused_before_anything_is_written(saved_run, corpus_cache, tmp_path,
                                                                              monkeypatch, flag, where):
    """Problem 6: `--save CK/iter_0000001` was accepted, and wrote `latest` and iter_0000002 inside that
    checkpoint; a later --load of it (or zero_to_fp32) then silently read iteration 2."""
    before = snapshot(saved_run)
    no_work(monkeypatch)
    argv = ["--metrics-file", tmp_path / "m.jsonl"] if flag != "--metrics-file" else []
    outcome = run_main(pretrain_gpt.main, TINY + ["--tokenizer-vocab-size", "512", "--data-cache-dir", corpus_cache,
                                                  *map(str, argv), flag, str(saved_run / where)])
    line = outcome.one_error_line(f"{flag} {saved_run / where}")
    assert str(saved_run) in line
    assert snapshot(saved_run) == before  # nothing created inside, no lock left


def test_save_may_still_be_a_save_directory_with_metrics_beside_its_checkpoints(saved_run, corpus_cache, tmp_path):
    """What must keep working: --save CK --load CK resumes, with --metrics-file CK/metrics.jsonl."""
    ck = Path(shutil.copytree(saved_run, tmp_path / "ck"))
    (ck / LATEST_FILE).write_text("iter_0000001\n")
    outcome = train(corpus_cache, ck / "metrics.jsonl", "--save", ck, "--load", ck)
    assert outcome.code == 0, outcome.err
    assert "resuming after iteration 1" in outcome.out


# ---- 8. symlinked outputs are written through ------------------------------------------------------

def test_a_symlinked_metrics_file_stays_a_link_and_its_target_gets_the_records(corpus_cache, tmp_path):
    """Problem 8: the resume's atomic rewrite replaced the link with a regular file; the target kept
    the stale record and never got the new ones."""
    target = tmp_path / "store" / "all-metrics.jsonl"
    target.parent.mkdir()
    target.write_text('{"iteration": 7, "note": "a record of another tool"}\n')
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(target)
    ck = tmp_path / "ck"
    assert train(corpus_cache, link, "--save", ck, "--train-iters", "3", "--save-interval", "2").code == 0
    (ck / LATEST_FILE).write_text("iter_0000002\n")
    resumed = train(corpus_cache, link, "--save", ck, "--load", ck, "--train-iters", "3")
    assert resumed.code == 0, resumed.err
    assert "dropped 1 records after iteration 2" in resumed.out
    assert link.is_symlink() and link.resolve() == target.resolve()
    records = metrics_records(target)
    assert records[0]["note"] == "a record of another tool"
    assert [r["iteration"] for r in records[1:]] == [1, 2, 3]
    assert records[3]["launch_id"] != records[1]["launch_id"]  # the resumed launch's record of iteration 3


# ---- 7. the resume data check compares content, not the words typed ----------------------------------

def corpus_in(workdir: Path, step: int) -> Path:
    """`workdir/data/corpus_text_document`: 60 documents of 40 tokens below 250, drawn by `step`."""
    (workdir / "data").mkdir(parents=True)
    return Path(write_dataset(workdir / "data" / "corpus_text_document",
                              [[(step * d + 3 * i + 1) % 250 for i in range(40)] for d in range(60)]))


def test_a_resume_checks_the_data_files_content_not_the_path_typed(tmp_path, monkeypatch):
    """Problem 7: the same relative --data-path typed in another working directory (other files)
    resumed silently; a copy of the same files under another path was refused. The checkpoint now
    records the files' identity (data/identity.py) and the resume compares that."""
    here, elsewhere, copy = tmp_path / "here", tmp_path / "elsewhere", tmp_path / "copy"
    corpus_in(here, 7)
    corpus_in(elsewhere, 11)
    shutil.copytree(here / "data", copy)
    ck, metrics = tmp_path / "ck", tmp_path / "metrics.jsonl"
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "256", "--split", "1,0,0",
            "--metrics-file", str(metrics), "--save", str(ck)]

    def run(*extra):
        return run_main(pretrain_gpt.main, TINY + null + [*map(str, extra)])

    monkeypatch.chdir(here)
    assert run("--data-path", "data/corpus_text_document").code == 0
    monkeypatch.chdir(elsewhere)
    resume = ["--load", ck, "--train-iters", "3", "--override-opt_param-scheduler"]
    line = run("--data-path", "data/corpus_text_document", *resume).one_error_line(
        "--data-path data/corpus_text_document", "--override-data-on-resume")
    assert "other content" in line and str(elsewhere / "data" / "corpus_text_document") in line
    outcome = run("--data-path", copy / "corpus_text_document", *resume)
    assert outcome.code == 0, outcome.err
    assert "resuming after iteration 2" in outcome.out


# ---- checkpoints saved before lineages ------------------------------------------------------------------

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint_84ae2c6"


def test_a_checkpoint_saved_before_lineages_resumes_under_a_new_one(tmp_path, corpus_cache_300):
    """tests/fixtures/checkpoint_84ae2c6 has no run_id: it still resumes, the run takes a new lineage,
    and what came before it (the old save, an old record without run_id) counts as another run's:
    --keep-last 1 leaves the old save, the resume leaves the old record."""
    cache = corpus_cache_300  # the fixture's embedded corpus, 300-token vocabulary
    ck = Path(shutil.copytree(LEGACY, tmp_path / "ck"))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"iteration": 3, "loss": 5.0}\n')  # the old run's, after its last save
    outcome = run_main(pretrain_gpt.main, [
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--tokenizer-vocab-size", "300", "--global-batch-size", "4",
        "--micro-batch-size", "2", "--train-iters", "4", "--zero-stage", "1", "--seed", "3", "--device", "cpu",
        "--eval-iters", "0", "--log-interval", "1", "--save-interval", "1", "--keep-last", "1",
        "--override-opt_param-scheduler", "--data-cache-dir", str(cache), "--metrics-file", str(metrics),
        "--save", str(ck), "--load", str(ck),
        # the fixture's activation (GPT-2's tanh GeLU): the resume check compares it with the run's
        "--activation", "gelu_tanh"])
    assert outcome.code == 0, outcome.err
    assert "resuming after iteration 2" in outcome.out
    records = metrics_records(metrics)
    assert records[0] == {"iteration": 3, "loss": 5.0}
    assert [r["iteration"] for r in records[1:]] == [3, 4]
    run_id = records[1]["run_id"]
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("iter_")) == ["iter_0000002", "iter_0000004"]
    assert "run_id" not in saved_metadata(ck / "iter_0000002")
    assert saved_metadata(ck / "iter_0000004")["run_id"] == run_id


def test_the_resume_cut_keeps_every_byte_that_is_not_its_own(tmp_path):
    """drop_redone_records on one file holding everything a shared metrics file can: records of another
    run after ours, a record without run_id (an older version's), bytes that are not UTF-8, and our
    last record cut short by a kill. Only our records after the resumed iteration and our cut line go."""
    from training.metrics import drop_redone_records, end_last_line

    ours, other = "a" * 32, "b" * 32
    kept = [json.dumps({"run_id": other, "iteration": 5}) + "\n", json.dumps({"run_id": ours, "iteration": 1}) + "\n",
            json.dumps({"run_id": other, "iteration": 9}) + "\n", '{"iteration": 7}\n']
    dropped = [json.dumps({"run_id": ours, "iteration": 2}) + "\n", json.dumps({"run_id": ours, "iteration": 3})[:60]]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes((kept[0] + kept[1] + dropped[0] + kept[2]).encode() + b"\xff\xfe not text\n"
                        + (kept[3] + dropped[1]).encode())
    assert drop_redone_records(str(metrics), 1, ours) == 2
    assert metrics.read_bytes() == "".join(kept[:3]).encode() + b"\xff\xfe not text\n" + kept[3].encode()
    metrics.write_bytes(kept[0].encode() + b'{"run_id": "' + other.encode()[:10])  # another run's, cut short
    assert drop_redone_records(str(metrics), 1, ours) == 0
    end_last_line(str(metrics))
    assert metrics.read_bytes() == kept[0].encode() + b'{"run_id": "' + other.encode()[:10] + b"\n"


def test_an_iteration_directory_that_an_older_run_saved_into_still_names_itself(saved_run, tmp_path):
    """Problem 6, for checkpoints the old code already polluted: `CK/iter_0000001` holding `latest` and
    iter_0000002 (written by a run given it as --save) loaded, and zero_to_fp32 read, iteration 2."""
    from checkpoint.format import resolve_checkpoint
    from scripts.tools import zero_to_fp32

    polluted = Path(shutil.copytree(saved_run / "iter_0000001", tmp_path / "iter_0000001"))
    shutil.copytree(saved_run / "iter_0000002", polluted / "iter_0000002")
    (polluted / LATEST_FILE).write_text("iter_0000002\n")
    assert resolve_checkpoint(polluted) == polluted
    out = tmp_path / "weights.safetensors"
    assert run_main(zero_to_fp32.main, [str(polluted), str(out)]).code == 0
    from safetensors import safe_open

    with safe_open(str(out), "pt") as exported:
        assert exported.metadata()["iteration"] == "1"


# ---- issue 94 item 6a: a metrics file per run by default ---------------------------------------------

def test_without_metrics_file_each_lineage_writes_its_own_and_its_resume_appends_to_it(corpus_cache, tmp_path,
                                                                                       monkeypatch):
    """Before: every run of a folder wrote runs/metrics.jsonl, and a second run started while the first
    trained was refused by the file's lock. Now runs/RUN_ID/metrics.jsonl, RUN_ID the lineage."""
    monkeypatch.chdir(tmp_path)
    tiny = TINY + ["--tokenizer-vocab-size", "512", "--data-cache-dir", corpus_cache]
    first = run_main(pretrain_gpt.main, tiny + ["--save", "ck", "--save-interval", "1"])
    second = run_main(pretrain_gpt.main, tiny)
    assert first.code == second.code == 0, first.err + second.err
    files = sorted(Path("runs").glob("*/metrics.jsonl"))
    assert len(files) == 2 and all(len(metrics_records(path)) == 2 for path in files)
    run_id = saved_metadata(Path("ck/iter_0000001"))["run_id"]
    Path("ck", LATEST_FILE).write_text("iter_0000001\n")  # killed after its first save
    mine = Path("runs", run_id, "metrics.jsonl")
    assert f"> draw the curves: python -m training.plot {mine} -o {mine.with_name('curves.png')}" in first.out
    resumed = run_main(pretrain_gpt.main, tiny + ["--save", "ck", "--load", "ck"])
    assert resumed.code == 0, resumed.err
    assert [(r["run_id"], r["iteration"]) for r in metrics_records(mine)] == [(run_id, 1), (run_id, 2)]
    assert len(list(Path("runs").glob("*/metrics.jsonl"))) == 2
    launches = metrics_records(mine.with_name("metrics.commands.jsonl"))  # the flags the plot labels runs by
    assert [launch["run_id"] for launch in launches] == [run_id, run_id]
    assert {"--save ck", "--num-layers 1", "--hidden-size 32"} <= set(launches[0]["flags"])


def test_wandb_save_dir_is_where_wandb_writes(corpus_cache, tmp_path, monkeypatch):
    """Issue 94 item 6d: Megatron-LM's --wandb-save-dir was accepted with no effect (W&B wrote beside the metrics)."""
    asked = {}

    def start_wandb(project, run_name, entity, config, directory):  # training/metrics.py's: wandb.init(dir=directory)
        asked.update(project=project, directory=directory)

    monkeypatch.setattr("training.run_outputs.start_wandb", start_wandb)  # W&B itself is not started
    outcome = train(corpus_cache, tmp_path / "metrics.jsonl", "--train-iters", "1", "--wandb-project", "p",
                    "--wandb-save-dir", tmp_path / "wb")
    assert outcome.code == 0, outcome.err
    assert asked == {"project": "p", "directory": str(tmp_path / "wb")} and (tmp_path / "wb").is_dir()
