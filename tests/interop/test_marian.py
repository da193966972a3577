"""`import_marian` against transformers: small random MarianMTModels made here (no download), saved with
save_pretrained, imported, and compared: logits, greedy and beam-4 translations, tokenizer ids, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from marian_models import opus_mt_tokenizer, saved_random, small_config

transformers = pytest.importorskip("transformers")

from nanomt.cli import main  # noqa: E402
from nanomt.core.checkpoint import load_checkpoint  # noqa: E402
from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.interop import MarianImportError, import_marian  # noqa: E402
from nanomt.training.synthetic import write_corpus  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_NEW = 12  # generated tokens, EOS included: generation_config.max_length counts the start token too
SENTENCES = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("toy"), pairs=400, valid=4, test=SENTENCES)


@pytest.fixture(scope="module", params=["shared", "separate"])
def marian_dir(request, corpus, tmp_path_factory) -> Path:
    """A random MarianMTModel with its tokenizer, saved as save_pretrained saves them."""
    shared = request.param == "shared"
    out = tmp_path_factory.mktemp(f"marian_{request.param}")
    tables = opus_mt_tokenizer(out, corpus, shared)
    vocab, pad = len(tables["vocab"]), tables["vocab"]["<pad>"]
    cfg = small_config(
        vocab,
        pad,
        decoder_vocab_size=len(tables.get("target_vocab_file", tables["vocab"])),
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=shared,
        activation_function="swish",
    )
    return saved_random(cfg, out, seed=0 if shared else 1, max_new=MAX_NEW)


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory) -> Path:
    return import_marian(marian_dir, tmp_path_factory.mktemp("run") / "run")


@pytest.fixture(scope="module")
def hf(marian_dir):
    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(marian_dir)


def generated(sequences: torch.Tensor, eos: int) -> list[list[int]]:
    """generate's rows without the start token, up to the first EOS (padding after it, if any, dropped)."""
    rows = [row[1:] for row in sequences.tolist()]
    return [row[: row.index(eos)] if eos in row else row for row in rows]


def test_logits_equal_transformers_on_a_padded_batch(imported, hf, corpus):
    hf_model, hf_tok = hf
    model, cfg, _ = load_checkpoint(imported)
    lines = corpus["test.src"].read_text().splitlines()[:6]
    targets = corpus["test.tgt"].read_text().splitlines()[:6]
    batch = hf_tok(lines, text_target=targets, return_tensors="pt", padding=True)
    assert (batch.input_ids == cfg.model.pad_id).any() and (batch.labels == cfg.model.pad_id).any()
    decoder_in = transformers.models.marian.modeling_marian.shift_tokens_right(
        batch.labels, cfg.model.pad_id, cfg.model.bos_id
    )
    with torch.no_grad():
        ref = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, decoder_input_ids=decoder_in)
        ours = model(batch.input_ids, decoder_in)
    diff = (ours - ref.logits).abs().max().item()
    print(f"largest logit difference: {diff:.2e} (logits up to {ref.logits.abs().max().item():.1f})")
    assert diff < 1e-4


def test_tokenizer_ids_equal_marian_tokenizers(imported, hf, corpus):
    _, hf_tok = hf
    _, cfg, tok = load_checkpoint(imported)
    lines = corpus["test.src"].read_text().splitlines() + [">>fra<< la zira", "Ωmega x", ""]
    targets = corpus["test.tgt"].read_text().splitlines() + ["tha yent Ω", ""]
    eos = cfg.model.eos_id
    assert [ids + [eos] for ids in tok.encode_src(lines)] == hf_tok(lines).input_ids
    assert [ids + [eos] for ids in tok.encode_tgt(targets)] == hf_tok(text_target=targets).input_ids
    ids = tok.encode_tgt(targets[:-2])
    assert tok.decode_tgt(ids) == hf_tok.batch_decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_equal_generate(imported, hf, corpus, beam):
    hf_model, hf_tok = hf
    lines = corpus["test.src"].read_text().splitlines()
    translator = Translator.from_checkpoint(imported)  # decoding settings from the imported config
    ours = [h[0].tokens for h in translator.translate_hypotheses(lines, beam_size=beam)]
    batch = hf_tok(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = generated(hf_model.generate(**batch, num_beams=beam), translator.cfg.model.eos_id)
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"beam {beam}: {same}/{len(lines)} translations token-identical to generate")
    assert ours == theirs
    assert 0 < sum(len(t) < MAX_NEW for t in ours) < len(lines)  # some end with EOS, some are cut
    assert translator.translate(lines, beam_size=beam) == hf_tok.batch_decode(theirs, skip_special_tokens=True)


def test_imported_config_and_pytorch_bin(marian_dir, imported, tmp_path):
    _, cfg, _ = load_checkpoint(imported)
    m, d = cfg.model, cfg.decode
    assert (m.sinusoidal_layout, m.output_bias, m.norm_first, m.activation) == ("halves", True, False, "swish")
    assert m.bos_id == m.pad_id != m.eos_id == 0
    # Matrices padded to a multiple of 8 rows (these vocabularies are not), which the parity tests see through.
    model, _, _ = load_checkpoint(imported)
    rows = model.tgt_embed.tokens.weight.size(0)
    assert m.vocab_multiple == 8 and rows % 8 == 0 and rows > m.tgt_vocab_size
    assert (d.beam_size, d.length_penalty_kind, d.early_stopping, d.max_len_a, d.max_len_b) == (
        4,
        "average",
        False,
        0.0,
        MAX_NEW,
    )
    # The same model as pytorch_model.bin (a plain state dict, read with weights_only=True).
    hf_dir = tmp_path / "bin"
    shutil.copytree(marian_dir, hf_dir)
    state = transformers.MarianMTModel.from_pretrained(marian_dir).state_dict()
    torch.save(state, hf_dir / "pytorch_model.bin")
    (hf_dir / "model.safetensors").unlink()
    run = import_marian(hf_dir, tmp_path / "run")
    for name in ("model.safetensors", "config.yaml"):
        assert (run / name).read_bytes() == (imported / name).read_bytes()


def test_run_dir_works_with_the_cli(marian_dir, imported, corpus, tmp_path, capsys):
    main(["import", "marian", str(marian_dir), "--out", str(tmp_path / "cli_run")])
    assert capsys.readouterr().out.strip() == f"run directory: {tmp_path / 'cli_run'}"
    for name in ("config.yaml", "model.safetensors"):
        assert (tmp_path / "cli_run" / name).read_bytes() == (imported / name).read_bytes()
    out = tmp_path / "out.txt"
    main(["translate", str(imported), "--input", str(corpus["test.src"]), "--output", str(out), "--beam", "2"])
    assert len(out.read_text().splitlines()) == SENTENCES
    main(["evaluate", str(imported), "--src", str(corpus["test.src"]), "--ref", str(corpus["test.tgt"]), "--json"])
    assert "bleu" in capsys.readouterr().out.lower()
    main(["average", str(imported), str(imported), "--out", str(tmp_path / "avg")])
    line = corpus["test.src"].read_text().splitlines()[0]
    assert Translator.from_checkpoint(tmp_path / "avg").translate([line]) == Translator.from_checkpoint(
        imported
    ).translate([line])
    main(["plot", "attention", str(imported), line, "-o", str(tmp_path / "att.png")])
    assert (tmp_path / "att.png").stat().st_size > 0


def edit_config(hf_dir: Path, **changes) -> None:
    path = hf_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


REFUSALS = [
    ({"model_type": "bart"}, "model_type"),
    ({"architectures": ["MarianForCausalLM"]}, "architectures"),
    ({"normalize_before": True}, "normalize_before"),
    ({"scale_embedding": False}, "scale_embedding"),
    ({"decoder_attention_heads": 4}, "decoder_attention_heads"),
    ({"activation_function": "gelu_new"}, "activation_function"),
    ({"vocab_size": 999}, "vocab_size"),
    ({"eos_token_id": 5}, "eos_token_id"),
]


@pytest.mark.parametrize(("changes", "field"), REFUSALS, ids=[f for _, f in REFUSALS])
def test_what_does_not_map_is_refused_naming_the_field(marian_dir, tmp_path, changes, field):
    hf_dir = tmp_path / "hf"
    shutil.copytree(marian_dir, hf_dir)
    edit_config(hf_dir, **changes)
    with pytest.raises(MarianImportError, match=field) as e:
        import_marian(hf_dir, tmp_path / "run")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "source.spm", "vocab.json"])
def test_missing_files_are_refused_by_name(marian_dir, tmp_path, missing):
    hf_dir = tmp_path / "hf"
    shutil.copytree(marian_dir, hf_dir)
    (hf_dir / missing).unlink()
    expected = "model.safetensors or pytorch_model.bin" if missing == "model.safetensors" else missing
    with pytest.raises(MarianImportError, match=expected):
        import_marian(hf_dir, tmp_path / "run")
