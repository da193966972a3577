"""train.init_from: a run started from another checkpoint's model, tokenizer, special ids and weights; run
directories never overwritten; the special ids read from the model's config everywhere (a model whose ids are a
permutation of nanomt's trains to the same numbers)."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from conftest import tiny_config

from nanomt.cli import main
from nanomt.core.checkpoint import (
    WEIGHTS,
    average_checkpoints,
    load_checkpoint,
    read_weights,
    save_weights,
    step_dirs,
    write_checkpoint_dir,
)
from nanomt.core.config import ConfigError, config_from_dict, load_config
from nanomt.core.tokenizer import Tokenizer
from nanomt.decoding.translate import Translator
from nanomt.training import train as train_module
from nanomt.training.train import TrainingError, train

pytestmark = pytest.mark.usefixtures("one_thread")


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def tree_digest(path: Path) -> dict[str, str]:
    """Every file under `path` with the sha256 of its bytes."""
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in path.rglob("*") if p.is_file()
    }


def finetune_config(corpus, init_from: Path, **train) -> dict:
    """A fine-tuning config: no model section, no tokenizer settings."""
    cfg = tiny_config(corpus, init_from=str(init_from), **train)
    del cfg["model"]
    for key in ("vocab_size", "shared_vocab"):
        del cfg["data"][key]
    return cfg


@pytest.fixture(scope="module")
def base_run(toy_corpus, tmp_path_factory) -> Path:
    """A tiny model trained 40 steps on the toy pair: the checkpoint the tests start from."""
    cfg = tiny_config(toy_corpus, max_steps=40, eval_every=20, save_every=20)
    cfg["model"]["dropout"] = 0.0
    return train(config_from_dict(cfg), tmp_path_factory.mktemp("base") / "run")


def test_a_run_starts_from_the_checkpoints_model_and_weights_with_its_own_optimizer(toy_corpus, base_run, tmp_path):
    base_cfg = load_config(base_run / "config.yaml")
    cfg = config_from_dict(finetune_config(toy_corpus, base_run, max_steps=10, log_every=1, lr=1e-3))
    assert cfg.model == base_cfg.model and cfg.data.vocab_size == base_cfg.data.vocab_size
    run = train(cfg, tmp_path / "run")
    assert Tokenizer.load(run / "tokenizer").fingerprint() == Tokenizer.load(base_run / "tokenizer").fingerprint()
    # It starts where the checkpoint ended (a loss of ~2.5), not where a new model starts (~5): and from step 1.
    fresh = train(config_from_dict(tiny_config(toy_corpus, max_steps=1, log_every=1)), tmp_path / "fresh")
    first = losses(run)[0]
    assert first < losses(base_run)[-1] + 0.3 and first < losses(fresh)[0] - 1.5
    assert [s for s, _ in step_dirs(run)] == [10]
    state = torch.load(step_dirs(run)[0][1] / "trainer.pt", weights_only=True)
    assert state["step"] == 10 and state["optimizer"]["state"][0]["step"] == 10  # AdamW's own count: from 0
    saved = load_config(run / "config.yaml")  # resolved: loads without the checkpoint it started from
    assert saved.train.init_from is None and saved.model == base_cfg.model


def test_a_rerun_resumes_from_its_own_checkpoints_not_the_one_it_started_from(toy_corpus, base_run, tmp_path):
    whole = train(config_from_dict(finetune_config(toy_corpus, base_run, max_steps=12)), tmp_path / "whole")
    source = tmp_path / "source"  # a copy of the base checkpoint, changed once the run has started
    write_checkpoint_dir(
        source, load_config(base_run / "config.yaml"), base_run / "tokenizer", read_weights(base_run / WEIGHTS)
    )
    run = tmp_path / "run"
    train(config_from_dict(finetune_config(toy_corpus, source, max_steps=10)), run)
    zeros = {k: torch.zeros_like(v) for k, v in read_weights(source / WEIGHTS).items()}
    save_weights(zeros, source / WEIGHTS)
    train(config_from_dict(finetune_config(toy_corpus, source, max_steps=12)), run)
    a, b = read_weights(step_dirs(run)[-1][1] / WEIGHTS), read_weights(step_dirs(whole)[-1][1] / WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_any_checkpoint_directory_can_be_started_from(toy_corpus, base_run, tmp_path):
    step_20 = dict(step_dirs(base_run))[20]
    averaged = average_checkpoints([d for _, d in step_dirs(base_run)], tmp_path / "averaged")
    for name, source in (("step", step_20), ("averaged", averaged)):
        run = train(config_from_dict(finetune_config(toy_corpus, source, max_steps=1)), tmp_path / f"from_{name}")
        model, _, _ = load_checkpoint(run)
        start = read_weights(source / WEIGHTS)
        moved = [k for k, v in model.state_dict().items() if k in start and not torch.equal(v, start[k])]
        assert moved and max((model.state_dict()[k] - start[k]).abs().max() for k in moved) < 0.01  # one step


def test_model_keys_that_contradict_the_checkpoint_are_errors_dropout_is_not(toy_corpus, base_run):
    cfg = finetune_config(toy_corpus, base_run)
    cfg["model"] = {"d_model": 64}
    with pytest.raises(ConfigError, match=r"model\.d_model: 64 contradicts train\.init_from .* \(32\)"):
        config_from_dict(cfg)
    cfg["model"] = {"d_model": 32, "dropout": 0.3}  # matching, and free
    assert config_from_dict(cfg).model.dropout == 0.3
    cfg["model"], cfg["data"]["vocab_size"] = {}, 500
    with pytest.raises(ConfigError, match=r"data\.vocab_size: 500 contradicts"):
        config_from_dict(cfg)
    with pytest.raises(ConfigError, match="not a checkpoint directory"):
        config_from_dict(finetune_config(toy_corpus, base_run / "tokenizer"))


def test_a_checkpoint_whose_tokenizer_is_not_its_weights_is_refused_and_nothing_written(toy_corpus, base_run, tmp_path):
    other = tmp_path / "other"
    cfg = tiny_config(toy_corpus, max_steps=1)
    cfg["data"]["vocab_size"] = 110  # another tokenizer
    train(config_from_dict(cfg), tmp_path / "other_run")
    write_checkpoint_dir(
        other, load_config(base_run / "config.yaml"), base_run / "tokenizer", read_weights(base_run / WEIGHTS)
    )
    for f in (other / "tokenizer").iterdir():
        f.unlink()
    for f in (tmp_path / "other_run" / "tokenizer").iterdir():
        (other / "tokenizer" / f.name).write_bytes(f.read_bytes())
    with pytest.raises(TrainingError, match="its weights were trained with tokenizer"):
        train(config_from_dict(finetune_config(toy_corpus, other)), tmp_path / "run")
    assert not (tmp_path / "run" / "tokenizer").exists() and not (tmp_path / "run" / "config.yaml").exists()


# ---------------------------------------------------------------------------------------------------------
# Nothing is overwritten.


def refused_training(toy_corpus, tmp_path: Path, run_dir: Path, capsys) -> str:
    """`nanomt train` of a tiny config into `run_dir`, which it must refuse: its one line of error."""
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps(tiny_config(toy_corpus, max_steps=2)))
    with pytest.raises(SystemExit) as e:
        main(["train", str(config), "--run-dir", str(run_dir)])
    assert e.value.code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_train_refuses_a_directory_holding_a_model_it_did_not_train_and_leaves_it_as_it_was(
    toy_corpus, base_run, tmp_path, capsys
):
    averaged = average_checkpoints([d for _, d in step_dirs(base_run)], tmp_path / "averaged")
    before = tree_digest(averaged)
    err = refused_training(toy_corpus, tmp_path, averaged, capsys)
    assert "holds a model that was not trained there" in err and "init_from" in err
    assert tree_digest(averaged) == before


def test_train_refuses_a_run_dir_that_is_a_file_and_leaves_it_as_it_was(toy_corpus, tmp_path, capsys):
    a_file = tmp_path / "run"
    a_file.write_text("notes\n", encoding="utf-8")
    assert f"--run-dir {a_file} is not a directory" in refused_training(toy_corpus, tmp_path, a_file, capsys)
    assert a_file.read_text(encoding="utf-8") == "notes\n"


def test_train_refuses_another_runs_directory_with_another_config_and_leaves_it_as_it_was(
    toy_corpus, base_run, tmp_path
):
    before = tree_digest(base_run)
    cfg = tiny_config(toy_corpus, max_steps=50)
    cfg["model"]["d_model"] = 64
    with pytest.raises(TrainingError, match=r"another model config \(model\.d_model: 32 there, 64 now\)"):
        train(config_from_dict(cfg), base_run)
    assert tree_digest(base_run) == before


def test_init_from_the_run_directory_itself_is_refused(toy_corpus, base_run, tmp_path):
    with pytest.raises(TrainingError, match="is the --run-dir itself"):
        train(config_from_dict(finetune_config(toy_corpus, base_run)), base_run)


def test_cli_init_from(toy_corpus, base_run, tmp_path):
    config = tmp_path / "finetune.yaml"
    cfg = finetune_config(toy_corpus, base_run, max_steps=2)
    del cfg["train"]["init_from"]
    config.write_text(json.dumps(cfg))
    main(["train", str(config), "--run-dir", str(tmp_path / "run"), "--init-from", str(base_run)])
    assert load_config(tmp_path / "run" / "config.yaml").model == load_config(base_run / "config.yaml").model


# ---------------------------------------------------------------------------------------------------------
# Special ids: a model whose ids are a permutation of nanomt's trains to the same numbers.


def permutation(vocab: int) -> np.ndarray:
    """new id of old id i: pad 0 -> 5, unk 1 -> 1, bos 2 -> 7, eos 3 -> 0 (Marian puts </s> at 0), the rest shuffled."""
    fixed = {0: 5, 1: 1, 2: 7, 3: 0}
    rest = [i for i in range(vocab) if i not in fixed.values()]
    np.random.default_rng(0).shuffle(rest)
    perm = np.empty(vocab, np.int64)
    others = iter(rest)
    for i in range(vocab):
        perm[i] = fixed[i] if i in fixed else next(others)
    return perm


def permuted_checkpoint(base_run: Path, out: Path) -> np.ndarray:
    """The base model with every id i renamed perm[i]: an id table over the same SentencePiece model, rows moved."""
    cfg = load_config(base_run / "config.yaml")
    model_bytes = (base_run / "tokenizer" / "spm.model").read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    perm = permutation(sp.get_piece_size())
    table = {sp.id_to_piece(i): int(perm[i]) for i in range(sp.get_piece_size())}
    Tokenizer(model_bytes, vocab=table).save(out / "tokenizer_src")
    state = read_weights(base_run / WEIGHTS)
    for name, tensor in state.items():
        if tensor.dim() >= 1 and tensor.size(0) == len(perm) and name.split(".")[0] in ("src_embed", "output"):
            moved = torch.empty_like(tensor)
            moved[torch.from_numpy(perm)] = tensor
            state[name] = moved
    model = cfg.model.__class__(**{**cfg.model.__dict__, "pad_id": 5, "bos_id": 7, "eos_id": 0})
    write_checkpoint_dir(out, cfg.__class__(**{**cfg.__dict__, "model": model}), out / "tokenizer_src", state)
    return perm


@pytest.fixture(scope="module")
def shared_base(toy_corpus, tmp_path_factory) -> Path:
    cfg = tiny_config(toy_corpus, max_steps=150, eval_every=150, save_every=150)
    cfg["data"]["shared_vocab"] = True
    cfg["model"].update(share_embeddings=True, tie_output=True, dropout=0.0)
    return train(config_from_dict(cfg), tmp_path_factory.mktemp("shared") / "run")


def test_a_model_with_other_special_ids_trains_to_the_same_numbers(toy_corpus, shared_base, tmp_path, monkeypatch):
    """Batches, the loss's skipped positions, the weights and the translations of a permuted model: the same."""
    perm = permuted_checkpoint(shared_base, tmp_path / "permuted")
    batches = {}
    collate = train_module.collate

    def recording(corpus, indices, ids):
        batch = collate(corpus, indices, ids)
        batches.setdefault(ids, []).append(batch)
        return batch

    monkeypatch.setattr(train_module, "collate", recording)
    runs = {}
    for name, source in (("nanomt", shared_base), ("permuted", tmp_path / "permuted")):
        cfg = finetune_config(toy_corpus, source, max_steps=6, log_every=1, eval_every=3, valid_bleu_sentences=10)
        runs[name] = train(config_from_dict(cfg), tmp_path / f"run_{name}")
    (ours, mine), (theirs, other) = batches.items()
    assert ours == (0, 2, 3) and theirs == (5, 7, 0)
    to_new = torch.from_numpy(perm)
    for a, b in zip(mine[:6], other[:6], strict=True):  # the training batches, before any validation batch
        for field in ("src", "tgt_in", "tgt_out"):
            assert torch.equal(to_new[getattr(a, field)], getattr(b, field))
    assert losses(runs["permuted"]) == pytest.approx(losses(runs["nanomt"]), rel=1e-5)
    a, b = read_weights(runs["nanomt"] / WEIGHTS), read_weights(runs["permuted"] / WEIGHTS)
    d = load_config(shared_base / "config.yaml").model.d_model
    for name in a:
        moved = a[name]
        if name.split(".")[0] in ("src_embed", "output") and moved.size(0) == len(perm):
            moved = torch.empty_like(moved)
            moved[to_new] = a[name]
        # A key bias adds the same score to every key of a query: its gradient is 0 but for float rounding, which
        # Adam scales up to steps of lr. It is left out; all else agrees.
        keep = torch.ones(moved.size(0), dtype=torch.bool)
        if name.endswith("qkv.bias") or name.endswith(".kv.bias"):
            start = d if name.endswith("qkv.bias") else 0
            keep[start : start + d] = False
        torch.testing.assert_close(
            b[name][keep], moved[keep], rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )
    sources = (toy_corpus["test.src"]).read_text().splitlines()[:20]
    outputs = [Translator.from_checkpoint(runs[n]).translate(sources, beam_size=3) for n in ("nanomt", "permuted")]
    assert outputs[0] == outputs[1] and any(outputs[0])
