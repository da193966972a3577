"""`nanomt export marian` against transformers: trained toy runs and imported random Marian models exported, loaded
with MarianMTModel/MarianTokenizer and compared (ids, logits, greedy tokens, files); what Marian cannot hold refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import decoding, tiny_config, tokens
from marian_models import opus_mt_tokenizer, saved_random, small_config
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from nanomt.cli import main  # noqa: E402
from nanomt.core.checkpoint import load_checkpoint, model_state, write_checkpoint_dir  # noqa: E402
from nanomt.core.config import Config, ModelConfig, config_from_dict  # noqa: E402
from nanomt.core.model import Transformer  # noqa: E402
from nanomt.decoding.greedy import greedy  # noqa: E402
from nanomt.interop import MarianExportError, export_marian, import_marian  # noqa: E402
from nanomt.training.synthetic import write_corpus  # noqa: E402
from nanomt.training.train import train  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # foreign converters and loaders

MAX_LEN = 12  # generated tokens, EOS included
# Post-norm, Marian's sinusoid table; one vocabulary with shared and tied embeddings, or two with an untied output,
# an output bias and decoders deeper than encoders. Matrices padded past the vocabulary in both.
VARIANTS = {
    "shared": (
        {"shared_vocab": True},
        {"share_embeddings": True, "tie_output": True, "vocab_multiple": 16},
    ),
    "separate": (
        {"shared_vocab": False},
        {"output_bias": True, "activation": "swish", "n_decoder_layers": 2, "vocab_multiple": 8},
    ),
}
MARIAN = {"norm_first": False, "sinusoidal_layout": "halves"}


def shift_right(labels: torch.Tensor, pad: int, start: int) -> torch.Tensor:
    return transformers.models.marian.modeling_marian.shift_tokens_right(labels, pad, start)


def generated(sequences: torch.Tensor, eos: int) -> list[list[int]]:
    """generate's rows without the start token, up to the first EOS."""
    rows = [row[1:] for row in sequences.tolist()]
    return [row[: row.index(eos)] if eos in row else row for row in rows]


def logits_diff(model, hf_model, hf_tok, lines: list[str], targets: list[str]) -> float:
    """The largest difference of nanomt's and transformers' teacher-forced logits on a padded batch."""
    m = model.cfg
    batch = hf_tok(lines, text_target=targets, return_tensors="pt", padding=True)
    assert (batch.input_ids == m.pad_id).any() and (batch.labels == m.pad_id).any()
    decoder_in = shift_right(batch.labels, m.pad_id, m.bos_id)
    with torch.no_grad():
        ref = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, decoder_input_ids=decoder_in)
        ours = model(batch.input_ids, decoder_in)
    theirs = ref.logits
    assert torch.equal(ours.isinf(), theirs.isinf())  # restrict_output's unscored ids: -inf in both
    finite = ours.isfinite()
    return (ours[finite] - theirs[finite]).abs().max().item()


def hf_load(hf_dir: Path):
    """The export as transformers loads it: the model in eval mode, and its tokenizer."""
    model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(hf_dir)


# ---------------------------------------------------------------------------------------------------------
# Runs trained by nanomt.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(toy_corpus, tmp_path_factory, one_thread) -> dict[str, Path]:
    """The variants trained 200 steps each (~3 s): enough that their translations are not all one sentence."""
    out = {}
    for name, (data, model) in VARIANTS.items():
        cfg = tiny_config(toy_corpus, max_steps=200, eval_every=200, save_every=200, lr=5e-3, max_tokens=1000)
        cfg["data"].update(data)
        cfg["model"].update(MARIAN, **model)
        out[name] = tmp_path_factory.mktemp(name) / "run"
        train(config_from_dict(cfg), out[name])
    return out


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request, runs) -> Path:
    return runs[request.param]


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory) -> Path:
    return export_marian(run, tmp_path_factory.mktemp("hf") / "marian")


@pytest.fixture(scope="module")
def sentences(toy_corpus) -> tuple[list[str], list[str]]:
    src = toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()
    return src, toy_corpus["test.tgt"].read_text(encoding="utf-8").splitlines()


def test_marian_tokenizer_gives_nanomt_s_ids(run, exported, sentences):
    _, _, tok = load_checkpoint(run)
    hf_tok = transformers.MarianTokenizer.from_pretrained(exported)
    src, tgt = sentences[0][:20] + ["Ωmega x", ""], sentences[1][:20] + ["tha Ω", ""]
    eos = tok.eos_id
    assert hf_tok(src).input_ids == [ids + [eos] for ids in tok.encode_src(src)]
    assert hf_tok(text_target=tgt).input_ids == [ids + [eos] for ids in tok.encode_tgt(tgt)]
    ids = tok.encode_tgt(sentences[1][:20])
    assert hf_tok.batch_decode(ids, skip_special_tokens=True) == tok.decode_tgt(ids)


def test_logits_and_greedy_tokens_are_nanomt_s(run, exported, sentences):
    model, cfg, tok = load_checkpoint(run)
    hf_model, hf_tok = hf_load(exported)
    diff = logits_diff(model, hf_model, hf_tok, sentences[0][:8], sentences[1][:8])
    print(f"largest logit difference: {diff:.2e}")
    assert diff < 1e-4
    src = sentences[0]
    batch = hf_tok(src, return_tensors="pt", padding=True)
    ours = tokens(greedy(model, batch.input_ids, decoding(MAX_LEN)))
    with torch.no_grad():  # PAD and BOS banned by the exported generation_config, as nanomt never generates them
        out = hf_model.generate(**batch, num_beams=1, max_length=MAX_LEN + 1)
    theirs = generated(out, cfg.model.eos_id)
    assert ours == theirs
    assert len(set(map(tuple, ours))) > 20  # a model that says one sentence to everything would prove little
    assert 0 < sum(len(t) < MAX_LEN for t in ours) < len(src)  # some end with EOS, some are cut
    assert hf_tok.batch_decode(theirs, skip_special_tokens=True) == tok.decode_tgt(ours)


def test_config_files_and_back_through_import(run, exported, tmp_path):
    model, cfg, _ = load_checkpoint(run)
    m, separate = cfg.model, not cfg.data.shared_vocab
    names = {"config.json", "generation_config.json", "model.safetensors", "source.spm", "target.spm"}
    names |= {"vocab.json", "tokenizer_config.json"} | ({"target_vocab.json"} if separate else set())
    assert {p.name for p in exported.iterdir()} == names
    hf = json.loads((exported / "config.json").read_text())
    assert (hf["share_encoder_decoder_embeddings"], hf["tie_word_embeddings"]) == (m.share_embeddings, m.tie_output)
    assert (hf["encoder_layers"], hf["decoder_layers"]) == (m.n_encoder_layers, m.n_decoder_layers)
    assert (hf["pad_token_id"], hf["eos_token_id"], hf["decoder_start_token_id"]) == (0, 3, 2)
    assert hf["forced_eos_token_id"] is None and hf["vocab_size"] == m.src_vocab_size
    gen = json.loads((exported / "generation_config.json").read_text())
    # tiny_config's budget is relative to the source (max_len_a 1.5): the model's positions bound it instead.
    assert (gen["num_beams"], gen["max_length"], gen["bad_words_ids"]) == (2, m.max_positions + 1, [[0], [2]])
    weights = load_file(str(exported / "model.safetensors"))
    assert weights["final_logits_bias"].shape == (1, m.tgt_vocab_size)  # no rows of vocab_multiple's padding
    assert ("lm_head.weight" in weights) == (not m.tie_output)
    # Back into nanomt: the same logits.
    back, _, _ = load_checkpoint(import_marian(exported, tmp_path / "back"))
    src, tgt = torch.tensor([[20, 30, 40, 3], [50, 3, 0, 0]]), torch.tensor([[2, 7, 8], [2, 9, 0]])
    with torch.no_grad():
        assert (back(src, tgt) - model(src, tgt)).abs().max().item() < 1e-5


# ---------------------------------------------------------------------------------------------------------
# A Marian model imported, and exported back.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["shared", "separate"])
def marian_dir(request, tmp_path_factory) -> Path:
    """A random MarianMTModel with its tokenizer, saved with save_pretrained (as interop/test_marian.py builds it)."""
    shared = request.param == "shared"
    out = tmp_path_factory.mktemp(f"marian_{request.param}")
    corpus = write_corpus(tmp_path_factory.mktemp("toy"), pairs=400, valid=4, test=8)
    tables = opus_mt_tokenizer(out, corpus, shared)
    cfg = small_config(
        len(tables["vocab"]),
        tables["vocab"]["<pad>"],
        decoder_vocab_size=len(tables.get("target_vocab_file", tables["vocab"])),
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=shared,
        activation_function="swish",
    )
    return saved_random(cfg, out, seed=0 if shared else 1, max_new=MAX_LEN, eos_bias=0.0)


CONFIG_KEYS = [
    "vocab_size",
    "decoder_vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "activation_function",
    "max_position_embeddings",
    "scale_embedding",
    "share_encoder_decoder_embeddings",
    "tie_word_embeddings",
    "pad_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "forced_eos_token_id",
    "dropout",
    "attention_dropout",
    "activation_dropout",
]
GENERATION_KEYS = ["num_beams", "max_length", "bad_words_ids", "early_stopping", "length_penalty"]


def test_imported_marian_exports_back(marian_dir, tmp_path):
    run = import_marian(marian_dir, tmp_path / "run")
    out = export_marian(run, tmp_path / "hf")
    theirs, ours = (json.loads((d / "config.json").read_text()) for d in (marian_dir, out))
    assert {k: ours[k] for k in CONFIG_KEYS} == {k: theirs[k] for k in CONFIG_KEYS}
    theirs, ours = (json.loads((d / "generation_config.json").read_text()) for d in (marian_dir, out))
    assert {k: ours[k] for k in GENERATION_KEYS} == {k: theirs[k] for k in GENERATION_KEYS}
    for name in ("source.spm", "target.spm", "vocab.json", "target_vocab.json"):
        assert (marian_dir / name).is_file() == (out / name).is_file(), name
        if name.endswith(".json") and (out / name).is_file():
            assert json.loads((out / name).read_text()) == json.loads((marian_dir / name).read_text())
        elif (out / name).is_file():
            assert (out / name).read_bytes() == (marian_dir / name).read_bytes()
    theirs, ours = (load_file(str(d / "model.safetensors")) for d in (marian_dir, out))
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    # The export in transformers and the imported run in nanomt: the same logits.
    model, _, _ = load_checkpoint(run)
    hf_model, hf_tok = hf_load(out)
    lines = ["la zira tha", ">>fra<< yent", "zira"]
    assert logits_diff(model, hf_model, hf_tok, lines, ["tha yent", "la", "zira zira yent"]) < 1e-4
    # And imported again: the same nanomt run.
    again = import_marian(out, tmp_path / "again")
    for name in ("config.yaml", "model.safetensors"):
        assert (again / name).read_bytes() == (run / name).read_bytes(), name


# ---------------------------------------------------------------------------------------------------------
# What Marian cannot express, and restrict_output, which it can: random models with a trained run's tokenizer.
# ---------------------------------------------------------------------------------------------------------


def random_checkpoint(run: Path, out: Path, seed: int = 0, **changes) -> Path:
    """A random model of the run's vocabularies (Marian's options unless `changes` says otherwise), saved."""
    _, cfg, tok = load_checkpoint(run)
    kw = dict(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, max_positions=64)
    model_cfg = ModelConfig(tok.src_vocab_size, tok.tgt_vocab_size, **{**kw, **MARIAN, **changes})
    torch.manual_seed(seed)
    model = Transformer(model_cfg).eval()
    return write_checkpoint_dir(out, Config(model=model_cfg, data=cfg.data), run / "tokenizer", model_state(model))


REFUSALS = [
    ({"norm_first": True}, "model.norm_first"),
    ({"positional": "learned", "sinusoidal_layout": "interleaved"}, "model.positional"),
    ({"sinusoidal_layout": "interleaved"}, "model.sinusoidal_layout"),
    ({"layer_norm_eps": 1e-6}, "model.layer_norm_eps"),
    (None, "ensemble"),
]


@pytest.mark.parametrize(("changes", "option"), REFUSALS, ids=[o for _, o in REFUSALS])
def test_what_marian_cannot_express_is_refused(runs, tmp_path, changes, option):
    ckpt = random_checkpoint(runs["shared"], tmp_path / "ckpt", **(changes or {}))
    with pytest.raises(MarianExportError, match=option) as e:
        export_marian([ckpt, ckpt] if changes is None else ckpt, tmp_path / "hf")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "hf").exists()


def test_restrict_output_is_a_minus_infinity_bias(runs, sentences, tmp_path):
    _, cfg, tok = load_checkpoint(runs["shared"])
    ckpt = random_checkpoint(runs["shared"], tmp_path / "ckpt", seed=1, restrict_output=True, n_decoder_layers=2)
    model, _, _ = load_checkpoint(ckpt)
    kept = sorted({i for ids in tok.encode_tgt(sentences[1]) for i in ids} | {cfg.model.eos_id})
    model.set_output_vocab(torch.tensor(kept))
    write_checkpoint_dir(ckpt, Config(model=model.cfg, data=cfg.data), ckpt / "tokenizer", model_state(model))
    model, _, _ = load_checkpoint(ckpt)
    hf_model, hf_tok = hf_load(export_marian(ckpt, tmp_path / "hf"))
    assert logits_diff(model, hf_model, hf_tok, sentences[0][:8], sentences[1][:8]) < 1e-4
    batch = hf_tok(sentences[0][:20], return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = generated(hf_model.generate(**batch, num_beams=1, max_length=MAX_LEN + 1), cfg.model.eos_id)
    assert tokens(greedy(model, batch.input_ids, decoding(MAX_LEN))) == theirs
    assert {i for t in theirs for i in t} <= set(kept)


# ---------------------------------------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------------------------------------


def test_cli_exports_and_refuses_a_directory_with_files(runs, tmp_path, capsys):
    run, out = runs["shared"], tmp_path / "hf"
    main(["export", "marian", str(run), "--out", str(out)])
    assert capsys.readouterr().out.strip() == f"exported to {out}"
    assert (out / "model.safetensors").is_file()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    refusals = {
        "not empty": [str(run), "--out", str(out)],
        "ensemble": [str(run), str(run), "--out", str(tmp_path / "two")],
    }
    for reason, args in refusals.items():
        with pytest.raises(SystemExit) as e:
            main(["export", "marian", *args])
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.startswith("nanomt: error:") and err.count("\n") == 1, err
        assert reason in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "two").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temporary directory left behind
