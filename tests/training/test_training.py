"""End to end: pretrain_gpt.main on the embedded corpus, in-process, with a small model."""

import json
import math

import pytest

import pretrain_gpt

SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "4", "--global-batch-size", "8",
         "--lr", "3e-3", "--lr-warmup-iters", "5", "--log-interval", "1", "--eval-interval", "20",
         "--eval-iters", "2", "--tokenizer-vocab-size", "512", "--device", "cpu"]


@pytest.fixture(scope="module")
def corpus_cache(tmp_path_factory):
    """One prepared embedded corpus shared by every run in this module (tokenizer training is slow)."""
    return str(tmp_path_factory.mktemp("corpus-cache"))


def run(tmp_path, corpus_cache, *extra):
    metrics = tmp_path / "metrics.jsonl"
    code = pretrain_gpt.main(SMALL + ["--data-cache-dir", corpus_cache, "--metrics-file", str(metrics), *extra])
    assert code == 0
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def train_records(records):
    return [r for r in records if "split" not in r]


def test_training_reduces_loss_and_writes_metrics(tmp_path, corpus_cache, capsys):
    records = run(tmp_path, corpus_cache, "--train-iters", "40")
    out = capsys.readouterr().out
    train = train_records(records)
    assert [r["iteration"] for r in train] == list(range(1, 41))
    for key in ("iteration", "consumed_samples", "loss", "lr", "grad_norm", "iter_time_s", "tokens_per_s",
                "tflops_per_gpu"):
        assert all(key in r for r in train), key
    assert train[-1]["consumed_samples"] == 40 * 8
    first, last = sum(r["loss"] for r in train[:5]) / 5, sum(r["loss"] for r in train[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert math.isclose(train[0]["loss"], math.log(512), rel_tol=0.1)  # starts near uniform
    evals = [r for r in records if "split" in r]
    assert [(r["split"], r["iteration"]) for r in evals] == [("valid", 20), ("valid", 40), ("test", 40)]
    assert evals[1]["loss"] < evals[0]["loss"]
    assert all(math.isclose(r["ppl"], math.exp(r["loss"])) for r in evals)
    assert "lm loss PPL" in out and "final validation perplexity" in out
    assert "iteration        1/      40 | consumed samples:" in out


def test_same_seed_same_losses_other_seed_differs(tmp_path, corpus_cache):
    a = run(tmp_path / "a", corpus_cache, "--train-iters", "5", "--eval-iters", "0")
    b = run(tmp_path / "b", corpus_cache, "--train-iters", "5", "--eval-iters", "0")
    c = run(tmp_path / "c", corpus_cache, "--train-iters", "5", "--eval-iters", "0", "--seed", "7")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["loss"] for r in a] != [r["loss"] for r in c]


def test_gradient_accumulation_matches_one_big_micro_batch(tmp_path, corpus_cache):
    """Global batch 8 as 2 x 4 or as 1 x 8 is the same optimisation (dropout off, fp32)."""
    common = ["--train-iters", "4", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0"]
    accumulated = run(tmp_path / "a", corpus_cache, *common)
    single = run(tmp_path / "b", corpus_cache, *common, "--micro-batch-size", "8")
    for x, y in zip(accumulated, single):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)


def test_bf16_trains(tmp_path, corpus_cache):
    records = train_records(run(tmp_path, corpus_cache, "--train-iters", "20", "--bf16", "--eval-iters", "0"))
    assert all(math.isfinite(r["loss"]) for r in records)
    assert records[-1]["loss"] < records[0]["loss"]


def test_wandb_offline_gets_the_same_records(tmp_path, corpus_cache, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run(tmp_path, corpus_cache, "--train-iters", "3", "--eval-iters", "0", "--wandb-project", "ci-test")
    assert list((tmp_path / "wandb").glob("offline-run-*")), "W&B wrote no offline run"


def test_broken_wandb_never_breaks_training(tmp_path, corpus_cache, monkeypatch, capsys):
    import wandb

    def refuse(*args, **kwargs):
        raise RuntimeError("no login")

    monkeypatch.setattr(wandb, "init", refuse)
    records = run(tmp_path, corpus_cache, "--train-iters", "3", "--eval-iters", "0", "--wandb-project", "x")
    assert len(records) == 3
    assert "W&B did not start" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["missing", "truncated_bin", "wrong_magic"])
def test_bad_data_is_one_line_exit_2_naming_the_file(damage, tmp_path, corpus_cache, capsys):
    import shutil

    from data.corpus import prepare_default_corpus

    corpus = prepare_default_corpus(corpus_cache, 512)
    prefix = tmp_path / "copy_text_document"
    if damage != "missing":
        for ext in (".bin", ".idx"):
            shutil.copy(corpus.data_prefix + ext, str(prefix) + ext)
    if damage == "truncated_bin":
        with open(str(prefix) + ".bin", "r+b") as f:
            f.truncate(f.seek(0, 2) - 10)
    if damage == "wrong_magic":
        with open(str(prefix) + ".idx", "r+b") as f:
            f.write(b"NOTMMIDX")
    capsys.readouterr()  # drop the corpus build's progress line: only main's output is checked
    code = pretrain_gpt.main(SMALL + ["--data-path", str(prefix),
                                      "--tokenizer-file", corpus.tokenizer_dir + "/tokenizer.json",
                                      "--metrics-file", str(tmp_path / "m.jsonl")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("pretrain_gpt.py: error:"), err
    assert "copy_text_document" in err, err


def test_own_data_with_blending_trains(tmp_path, corpus_cache):
    from data.corpus import prepare_default_corpus

    corpus = prepare_default_corpus(corpus_cache, 512)
    records = run(tmp_path, corpus_cache, "--train-iters", "3", "--eval-iters", "1",
                  "--data-path", "0.3", corpus.data_prefix, "0.7", corpus.data_prefix,
                  "--tokenizer-file", corpus.tokenizer_dir + "/tokenizer.json")
    assert [r.get("split") for r in records] == [None, None, None, "valid", "test"]


def test_data_cache_path_holds_the_index_caches_as_in_megatron(tmp_path, corpus_cache):
    """Megatron-LM's --data-cache-path is where its GPTDataset writes the sample, document and shuffle indices
    (megatron/core/datasets/gpt_dataset.py: path_to_cache); before, they went beside the data whatever it said,
    so a read-only data folder rebuilt them every run."""
    import shutil

    from data.corpus import prepare_default_corpus

    corpus = prepare_default_corpus(corpus_cache, 512)
    data = tmp_path / "data"
    data.mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(corpus.data_prefix + ext, str(data / "copy_text_document") + ext)
    cache = tmp_path / "index-cache"
    code = pretrain_gpt.main(SMALL + ["--data-path", str(data / "copy_text_document"), "--data-cache-path", str(cache),
                                      "--tokenizer-file", corpus.tokenizer_dir + "/tokenizer.json",
                                      "--metrics-file", str(tmp_path / "m.jsonl")])
    assert code == 0
    assert list(data.glob("*.npy")) == []
    assert len(list(cache.glob("*.npy"))) >= 3  # the train split's document, sample and shuffle indices
