"""Documents through a real (tiny) model: nothing cut, paragraphs as their sentences, HTML, files, unknown pieces."""

import io
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
from conftest import NANOMT, run_nanomt, tiny_config
from paths import DATA

from nanomt.decoding.pieces import cut_sentence
from nanomt.decoding.translate import Translator, src_limit
from nanomt.documents import files, markup
from nanomt.documents import translation as dt


@pytest.fixture(scope="module")
def run_dir(toy_corpus, trained):
    return trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60))


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_checkpoint(run_dir)


@pytest.fixture(scope="module")
def toy_lines(toy_corpus):
    return toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()


def cli(*args, input=None):
    return run_nanomt(*args, input=input)


def in_order(parts: list[str], text: str) -> bool:
    """Every part found in text, each after the one before."""
    at = 0
    for part in parts:
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


def long_line(toy_lines: list[str], tokens: int, count) -> str:
    """One line of toy sentences joined by commas, of at least `tokens` source tokens."""
    parts, line = [], ""
    while count([line])[0] < tokens:
        parts += [t.rstrip(".") for t in toy_lines]
        line = ", ".join(parts) + "."
    return line


def test_a_5000_token_line_is_translated_whole_in_pieces(run_dir, translator, toy_lines):
    line = long_line(toy_lines, 5000, translator.count_tokens)
    assert translator.count_tokens([line])[0] >= 5000
    limit = src_limit(translator.cfg)
    pieces = cut_sentence(line, limit, translator.count_tokens)
    assert len(pieces) > 5000 / limit and max(translator.count_tokens(pieces)) <= limit
    assert re.sub(r"\s", "", "".join(pieces)) == re.sub(r"\s", "", line)  # every character in a piece
    expected = translator.translate(pieces, beam_size=2)
    [out] = translator.translate([line, ""], beam_size=2)[:1]
    assert in_order([e for e in expected if e], out)
    # the n-best lists join too: the best is the translation above, scores summed over the pieces
    [hyps] = translator.translate_n_best([line], n_best=2, beam_size=2)
    assert hyps[0][0] == out and len(hyps) == 2
    # nanomt translate keeps it whole as well, and says nothing of truncation
    res = cli("translate", run_dir, "--beam", 2, input=(line + "\n").encode())
    assert res.returncode == 0 and res.stdout.decode().rstrip("\n") == out
    assert b"truncat" not in res.stderr


def test_paragraphs_translate_as_their_sentences_one_by_one(translator, toy_lines):
    # Paragraphs of 2-6 consecutive sentences of the toy language (the model's), in varied spacing: the same text as
    # each sentence translated alone and joined by the same spacing. (The committed news sample checks the
    # segmentation of real text: tests/documents/test_documents.py.)
    _, n_best, source = dt.for_translator(translator)
    paragraphs, gaps, at = [], [" ", "  ", " ", "\t"], 0
    for size in [2, 3, 4, 5, 6] * 6:
        paragraphs.append(toy_lines[at : at + size])
        at += size
    texts = ["".join(s + gaps[k % 4] for k, s in enumerate(p)).rstrip() for p in paragraphs]
    alone = translator.translate([s for p in paragraphs for s in p])
    expected, i = [], 0
    for p in paragraphs:
        expected.append("".join(t + gaps[k % 4] for k, t in enumerate(alone[i : i + len(p)])).rstrip())
        i += len(p)
    got = [t.text for t in dt.paragraphs(texts, n_best, source, split=True)]
    same = sum(g == e for g, e in zip(got, expected))
    assert same >= 0.9 * len(texts), f"{same} of {len(texts)} paragraphs translate as their sentences"


def test_split_keeps_the_paragraph_shape_and_pass_through_spans(translator, toy_lines):
    _, n_best, source = dt.for_translator(translator)
    text = f"  {toy_lines[0]} {toy_lines[1]}\n\n{toy_lines[2]} see https://example.com/a_(b) or 😀 now.\n"
    [out] = dt.paragraphs([text], n_best, source, split=True)
    assert out.text.startswith("  ") and out.text.endswith("\n") and "\n\n" in out.text
    assert "https://example.com/a_(b)" in out.text and "😀" in out.text
    assert not out.cut
    # without split: one sentence, as Translator.translate has it
    [plain] = dt.paragraphs([toy_lines[0]], n_best, source, split=False)
    assert plain.text == translator.translate([toy_lines[0]])[0]


def test_alternatives_and_scores_come_from_the_n_best_list(translator, toy_lines):
    decoding = translator.default_decoding.replace(beam_size=4, n_best=3)
    _, n_best, source = dt.for_translator(translator, decoding)
    [out] = dt.paragraphs([toy_lines[3]], n_best, source, split=False, n_alternatives=2)
    hyps = translator.translate_n_best([toy_lines[3]], decoding=decoding)[0]
    assert out.text == hyps[0][0] and out.score == pytest.approx(hyps[0][1])
    assert out.alternatives and out.alternatives[0] == next(t for t, _ in hyps if t != hyps[0][0])
    assert hyps[0][0] not in out.alternatives


def test_a_piece_the_vocabulary_lacks_is_copied_not_dropped(translator, toy_lines):
    word = "Ωμέγα"  # Greek: no piece of the toy vocabulary
    sentence = f"{toy_lines[4].rstrip('.')} {word}."
    ids = translator.tokenizer.encode_src([sentence])[0]
    assert translator.tokenizer.unk_id in ids
    plain = translator.translate_n_best([sentence])[0][0][0]
    restored = translator.translate_n_best([sentence], replace_unknowns=True)[0][0][0]
    assert word not in plain and word in restored


def test_html_tags_go_around_the_aligned_words(translator, toy_lines):
    align, n_best, source = dt.for_translator(translator)
    sentence = toy_lines[5]
    words = sentence.split()
    tagged = f"<p>{' '.join(words[:1])} <b>{' '.join(words[1:3])}</b> {' '.join(words[3:])}</p>"
    [out] = dt.html([tagged], align, n_best, source)
    plain = translator.translate([sentence])[0]
    text = re.sub(r"<[^>]+>", "", out)
    assert text.split() == plain.split()  # the words of the tagged sentence are the plain sentence's
    assert out.startswith("<p>") and out.endswith("</p>") and out.count("<b>") == out.count("</b>") == 1
    # the alignment is the model's cross-attention
    [al] = translator.alignments([sentence])
    assert al.weights is not None and al.weights.shape == (len(al.tgt_pieces), len(al.src_pieces))


@pytest.mark.parametrize("name", ["files_sample.txt", "files_sample.html", "files_sample.md", "files_sample.srt"])
def test_files_round_trip_through_the_model(run_dir, translator, name, tmp_path):
    data = (DATA / name).read_bytes()
    out = tmp_path / f"out{Path(name).suffix}"
    res = cli("translate", run_dir, "--format", files.file_format(name), "-i", DATA / name, "-o", out)
    assert res.returncode == 0, res.stderr.decode()
    again = out.read_bytes()
    assert again and again != data
    if name.endswith(".srt"):
        import srt

        assert len(list(srt.parse(again.decode()))) == len(list(srt.parse(data.decode())))


def test_a_word_file_round_trips(run_dir, translator, tmp_path):
    docx = pytest.importorskip("docx")
    doc = docx.Document()
    p = doc.add_paragraph("la nuka ")
    p.add_run("belur").bold = True
    p.add_run(" korat.")
    src = tmp_path / "in.docx"
    doc.save(src)
    out = tmp_path / "out.docx"
    res = cli("translate", run_dir, "--format", "docx", "-i", src, "-o", out)
    assert res.returncode == 0, res.stderr.decode()
    translated = docx.Document(out)
    assert translated.paragraphs[0].text.strip()
    assert zipfile.is_zipfile(io.BytesIO(out.read_bytes()))


def test_cli_split_writes_a_line_per_input_line(run_dir, translator, toy_lines, tmp_path):
    lines = [f"{toy_lines[6]} {toy_lines[7]}", "", toy_lines[8]]
    res = cli("translate", run_dir, "--split", input="\n".join(lines).encode() + b"\n")
    assert res.returncode == 0, res.stderr.decode()
    out = res.stdout.decode().split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""
    two = translator.translate([toy_lines[6], toy_lines[7]])
    assert out[0] == " ".join(two)


def test_cli_refuses_what_does_not_combine(run_dir, translator, tmp_path):
    for args, problem in [
        (["--split", "--n-best", "2"], "--n-best"),
        (["--format", "html", "--split"], "--split"),
        (["--buffer-size", "0"], "--buffer-size"),
    ]:
        res = cli("translate", run_dir, *args, input=b"x\n")
        assert res.returncode == 1 and problem in res.stderr.decode() and res.stderr.decode().count("\n") == 1
    bad = tmp_path / "bad.docx"
    bad.write_bytes(b"not a zip")
    res = cli("translate", run_dir, "--format", "docx", "-i", bad, "-o", tmp_path / "o.docx")
    assert res.returncode == 1 and "docx" in res.stderr.decode().lower()
    assert not (tmp_path / "o.docx").exists()


def test_markup_alignment_is_used_for_inline_tags(translator, toy_lines):
    # markup.translate_html with the model's alignments puts <b> around the words attention points at; with the
    # position alignment instead, it still keeps every word: either way the words are the plain translation's.
    sentence = toy_lines[9]
    first, *rest = sentence.split()
    doc = f"<b>{first}</b> {' '.join(rest)}"
    by_model = markup.translate_html([doc], lambda ss: translator.alignments(ss))[0]
    assert re.sub(r"<[^>]+>", "", by_model).split() == translator.translate([sentence])[0].split()


def peak_rss_mb(args: list, stdin: Path, stdout: Path) -> float:
    """The largest resident memory (MB) of `nanomt ...args`, run alone under a fresh parent."""
    script = (
        "import resource, subprocess, sys\n"
        "cmd, src, dst = sys.argv[1:-2], sys.argv[-2], sys.argv[-1]\n"
        "with open(src, 'rb') as i, open(dst, 'wb') as o:\n"
        "    subprocess.run(cmd, stdin=i, stdout=o, check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    res = subprocess.run(
        [NANOMT[0], "-c", script, *NANOMT, *map(str, args), str(stdin), str(stdout)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip()) / 1024  # ru_maxrss is in KiB on Linux


@pytest.mark.slow  # a 49 MB file through a subprocess: make test runs it, make test-fast does not
def test_translate_streams_a_large_file_in_bounded_memory(run_dir, translator, toy_lines, tmp_path):
    # Lines of toy sentences padded with spaces to 512 bytes (the tokenizer drops the spaces, so the model has little
    # to decode): reading the whole input, as a list of lines, would take the file's size in memory.
    padded = [(s + " " * 512)[:511] + "\n" for s in toy_lines]
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text("".join(padded[i % len(padded)] for i in range(10_000)), encoding="utf-8")
    large.write_text("".join(padded[i % len(padded)] for i in range(100_000)), encoding="utf-8")
    args = ["translate", run_dir, "--beam", 1, "--buffer-size", 2000]
    base = peak_rss_mb(args, small, tmp_path / "small.out")
    peak = peak_rss_mb(args, large, tmp_path / "large.out")
    size_mb = large.stat().st_size / 2**20
    assert size_mb > 48
    assert peak - base < 16, f"memory grew {peak - base:.0f} MB from a 5 MB to a {size_mb:.0f} MB input"
    out = (tmp_path / "large.out").read_text(encoding="utf-8").split("\n")
    expected = translator.translate(toy_lines, beam_size=1)
    assert len(out) == 100_001 and out[-1] == ""
    assert all(out[i] == expected[i % len(expected)] for i in range(0, 100_000, 997))  # input order
