"""A multilingual Marian (opus-mt-en-ROMANCE's layout: >>fra<<, >>spa<<, ... in its vocabulary) made here with random
weights, imported, and compared with transformers for each target code: ids, logits, greedy and beam translations;
a missing or unknown code refused naming the model's codes; the codes kept through export marian."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
import torch
from marian_models import multilingual_marian
from test_marian import MAX_NEW, generated

transformers = pytest.importorskip("transformers")

from nanomt.cli import main  # noqa: E402
from nanomt.core.checkpoint import load_checkpoint  # noqa: E402
from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.interop import export_marian, import_marian  # noqa: E402
from nanomt.training.synthetic import write_corpus  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CODES = ("fra", "spa", "por")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("toy"), pairs=400, valid=4, test=12)


@pytest.fixture(scope="module")
def marian_dir(corpus, tmp_path_factory) -> Path:
    return multilingual_marian(tmp_path_factory.mktemp("marian_mul"), corpus, CODES, MAX_NEW)


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory) -> Path:
    return import_marian(marian_dir, tmp_path_factory.mktemp("run") / "run")


@pytest.fixture(scope="module")
def hf(marian_dir):
    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(marian_dir)


@pytest.fixture(scope="module")
def lines(corpus) -> list[str]:
    return corpus["test.src"].read_text().splitlines()


def test_the_codes_are_the_vocabularys_and_marian_tokenizers(imported, hf):
    _, hf_tok = hf
    _, _, tok = load_checkpoint(imported)
    assert tok.target_codes == CODES
    assert [f">>{c}<<" for c in tok.target_codes] == hf_tok.supported_language_codes


@pytest.mark.parametrize("code", CODES)
def test_ids_and_logits_equal_transformers_for_each_code(imported, hf, lines, code):
    hf_model, hf_tok = hf
    model, cfg, tok = load_checkpoint(imported)
    batch = hf_tok([f">>{code}<< {line}" for line in lines], return_tensors="pt", padding=True)
    lead, eos = tok.language_token(code), cfg.model.eos_id
    assert tok.language_token(f">>{code}<<") == lead
    ours = [lead + ids + [eos] for ids in tok.encode_src(lines)]
    assert ours == [row[: int(mask.sum())] for row, mask in zip(batch.input_ids.tolist(), batch.attention_mask)]
    start = torch.full((len(lines), 1), cfg.model.bos_id)
    with torch.no_grad():
        ref = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, decoder_input_ids=start)
        mine = model(batch.input_ids, start)
    diff = (mine - ref.logits).abs().max().item()
    print(f">>{code}<<: largest logit difference {diff:.2e}")
    assert diff < 1e-4


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_equal_generate_for_each_code(imported, hf, lines, beam):
    hf_model, hf_tok = hf
    translator = Translator.from_checkpoint(imported)
    outputs = {}
    for code in CODES:
        ours = [h[0].tokens for h in translator.translate_hypotheses(lines, beam_size=beam, target_lang=code)]
        batch = hf_tok([f">>{code}<< {line}" for line in lines], return_tensors="pt", padding=True)
        with torch.no_grad():
            theirs = generated(hf_model.generate(**batch, num_beams=beam), translator.cfg.model.eos_id)
        print(f"beam {beam} >>{code}<<: {sum(a == b for a, b in zip(ours, theirs))}/{len(lines)} token-identical")
        assert ours == theirs
        outputs[code] = ours
    assert len({tuple(map(tuple, o)) for o in outputs.values()}) == len(CODES)  # the code changes the translation


def test_a_missing_or_unknown_code_is_refused_naming_the_codes(imported, lines):
    translator = Translator.from_checkpoint(imported)
    with pytest.raises(ValueError, match="needs a target language; its codes: fra, spa, por"):
        translator.translate(lines[:1])
    with pytest.raises(ValueError, match="has no target language 'deu'; its codes: fra, spa, por"):
        translator.translate(lines[:1], target_lang="deu")


def test_a_leading_code_in_the_text_is_marians_way_of_asking(imported, lines):
    translator = Translator.from_checkpoint(imported)
    tagged = [f">>{code}<< {line}" for code, line in zip(CODES * 4, lines)]
    expected = [translator.translate([line], target_lang=code)[0] for code, line in zip(CODES * 4, lines)]
    assert translator.translate(tagged) == expected
    aligned = translator.alignments(tagged[:2])
    assert [a.translation for a in aligned] == expected[:2] and ">>fra<<" not in aligned[0].src_pieces
    assert aligned[0].weights.shape == (len(aligned[0].tgt_pieces), len(aligned[0].src_pieces))
    with pytest.raises(ValueError, match="text 1 starts with its own language token"):
        translator.translate(tagged[:1], target_lang="spa")
    with pytest.raises(ValueError, match="needs a target language"):
        translator.translate([tagged[0], lines[1]])


def test_a_code_given_to_a_model_of_one_target_is_refused(served_run):
    translator = Translator.from_checkpoint(served_run)
    with pytest.raises(ValueError, match="translates into one language"):
        translator.translate(["la zira"], target_lang="fra")


def test_the_command_line_takes_a_target_language(imported, lines, tmp_path, capsys):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(lines[:3]) + "\n")
    translator = Translator.from_checkpoint(imported)
    for code in ("spa", ">>spa<<"):
        main(["translate", str(imported), "--input", str(src), "--target-lang", code, "--beam", "2"])
        assert capsys.readouterr().out.splitlines() == translator.translate(lines[:3], beam_size=2, target_lang="spa")
    with pytest.raises(SystemExit) as e:
        main(["translate", str(imported), "--input", str(src)])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1 and "its codes: fra, spa, por" in err, err


def test_a_file_translated_for_a_target_language_is_tagged_with_it(imported, lines, tmp_path):
    odf = pytest.importorskip("odf.opendocument")
    from odf import text

    doc = odf.OpenDocumentText()
    doc.text.addElement(text.P(text=lines[0]))
    doc.save(str(tmp_path / "in.odt"))
    out = tmp_path / "out.odt"
    main(["translate", str(imported), "--format", "odt", "--target-lang", "spa", "--input", str(tmp_path / "in.odt"),
          "--output", str(out)])  # fmt: skip
    meta = zipfile.ZipFile(out).read("meta.xml").decode()
    assert re.search(r"<dc:language[^>]*>es</dc:language>", meta)  # spa, as a document's language tag: es
    expected = Translator.from_checkpoint(imported).translate(lines[:1], target_lang="spa")[0]
    assert expected in zipfile.ZipFile(out).read("content.xml").decode()


def test_the_codes_go_through_export_marian_and_back(imported, lines, tmp_path):
    exported = export_marian(imported, tmp_path / "hf")
    hf_tok = transformers.MarianTokenizer.from_pretrained(exported)
    assert hf_tok.supported_language_codes == [f">>{c}<<" for c in CODES]
    again = Translator.from_checkpoint(import_marian(exported, tmp_path / "again"))
    first = Translator.from_checkpoint(imported)
    assert again.tokenizer.target_codes == CODES
    assert again.translate(lines, target_lang="por") == first.translate(lines, target_lang="por")
