"""Inline tags go where the model's cross-attention puts their words, not where their position would: on hand-made
attention matrices, and end to end through Translator.alignments."""

import numpy as np
import pytest
from conftest import random_transformer

from nanomt.core.config import Config, DataConfig, DecodeConfig
from nanomt.core.tokenizer import train_tokenizer
from nanomt.decoding.translate import Translator
from nanomt.documents import markup
from nanomt.documents.markup import Alignment

# Source "der <b>Hund</b> bellt laut" as subword pieces, translated "the dog barks loudly" (one piece a word); each
# target word's attention peaks on one source word's pieces, with noise everywhere and a sink on </s>.
SRC_PIECES = ("▁der", "▁Hu", "nd", "▁bel", "lt", "▁laut", "</s>")
SRC_WORD_OF_PIECE = [0, 1, 1, 2, 2, 3, None]
TGT_WORDS = ["the", "dog", "barks", "loudly"]


def attention_matrix(align: list[int], seed: int) -> np.ndarray:
    """(target pieces + </s>, source pieces): target word t's peak on the pieces of source word align[t]."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0, 0.05, (len(align) + 1, len(SRC_PIECES)))
    weights[:, -1] += 0.4  # attention that sinks into </s> decides nothing
    for t, s in enumerate(align):
        cols = [p for p, w in enumerate(SRC_WORD_OF_PIECE) if w == s]
        weights[t, cols] += 0.5 / len(cols)
    return weights / weights.sum(1, keepdims=True)


def test_the_attention_matrix_decides_which_target_word_the_tag_wraps():
    """For each target word in turn, a matrix (rows permuted) points it at the tagged word: the tag wraps exactly
    that word, and moves with the matrix; by position it would always wrap the second word."""
    tgt_pieces = tuple("▁" + w for w in TGT_WORDS) + ("</s>",)
    base = attention_matrix([0, 1, 2, 3], seed=0)
    for k in range(len(TGT_WORDS)):
        rows = [(t - k + 1) % len(TGT_WORDS) for t in range(len(TGT_WORDS))]  # target word t <- source word rows[t]
        weights = np.vstack([base[rows], base[-1:]])
        assert rows[k] == 1  # target word k attends to "Hund"
        al = Alignment(" ".join(TGT_WORDS), SRC_PIECES, tgt_pieces, weights)
        out = markup.translate_html(["<p>der <b>Hund</b> bellt laut</p>"], lambda s, al=al: [al] * len(s))[0]
        expected = " ".join(f"<b>{w}</b>" if t == k else w for t, w in enumerate(TGT_WORDS))
        assert out == f"<p>{expected}</p>", f"the attention points target word {k} at the tagged word"


@pytest.fixture(scope="module")
def random_translator(toy_corpus, tmp_path_factory, one_thread) -> Translator:
    """A random tiny model with the toy corpus's tokenizer (as test_markup's wiring test builds it)."""
    lines = {n: toy_corpus[n].read_text(encoding="utf-8").splitlines() for n in ("train.src", "train.tgt")}
    data = DataConfig(vocab_size=120, shared_vocab=False)
    tokenizer = train_tokenizer(lines["train.src"], lines["train.tgt"], tmp_path_factory.mktemp("tok"), data)
    model = random_transformer(0, 120, layers=2)
    return Translator(model, tokenizer, Config(model=model.cfg, data=data, decode=DecodeConfig(beam_size=1)))


PLAIN = "un musko dunur fosur ke la nuka serur fosur dormat dikat."  # a toy sentence; <b> goes around each word


def tagged_docs(plain: str) -> list[str]:
    """One paragraph per source word, that word in <b>."""
    spans = [m.span() for m in markup.WORD.finditer(plain)]
    return [f"<p>{plain[:a]}<b>{plain[a:b]}</b>{plain[b:]}</p>" for a, b in spans]


def expected_placements(plain: str, al: Alignment) -> dict[int, str]:
    """Per tagged source word whose aligned target words (markup.align_words) are one contiguous run: the
    translation with <b> around that run."""
    src_words = [m.span() for m in markup.WORD.finditer(plain)]
    tgt_words, align = markup.align_words(plain, src_words, al)
    out = {}
    for j in range(len(src_words)):
        hits = [t for t, s in enumerate(align) if s == j]
        if hits and hits == list(range(hits[0], hits[-1] + 1)):
            a, b = tgt_words[hits[0]][0], tgt_words[hits[-1]][1]
            text, esc = al.translation, markup.escape_html
            out[j] = f"<p>{esc(text[:a])}<b>{esc(text[a:b])}</b>{esc(text[b:])}</p>"
    return out


def reversed_rows(al: Alignment) -> Alignment:
    """The alignment with its target pieces' attention rows in reverse order (the </s> row kept last)."""
    weights = np.array(al.weights)
    weights[:-1] = weights[:-1][::-1]
    return Alignment(al.translation, al.src_pieces, al.tgt_pieces, weights)


def test_the_translators_cross_attention_places_the_tag(random_translator, monkeypatch):
    """End to end through Translator.alignments: each tagged word's <b> wraps the target words markup.align_words
    aligns with it from the model's cross-attention; with the attention's target rows reversed, the tags follow."""
    translator = random_translator
    docs = tagged_docs(PLAIN)
    (al,) = translator.alignments([PLAIN])
    assert al.weights is not None and len(markup.WORD.findall(al.translation)) > 1
    by_position = expected_placements(PLAIN, Alignment(al.translation))
    placements = {}
    for name, wrap in (("model", lambda a: a), ("reversed", reversed_rows)):

        def wrapped(self, sentences, *args, original=Translator.alignments, wrap=wrap, **kwargs):
            return [wrap(a) for a in original(self, sentences, *args, **kwargs)]

        monkeypatch.setattr(Translator, "alignments", wrapped)
        out = markup.translate_html(docs, translator.alignments)
        monkeypatch.undo()
        placements[name] = expected_placements(PLAIN, wrap(al))
        assert placements[name], f"{name}: no tagged word has a contiguous translation to check"
        for j, expected in placements[name].items():
            assert out[j] == expected, f"{name} attention, <b> around source word {j}: {docs[j]}"
    # The two attentions put some tagged word elsewhere, and somewhere position alone would not.
    moved = [j for j in placements["model"] if placements["model"][j] != placements["reversed"].get(j)]
    assert moved, f"reversing the attention moved no tag: {placements}"
    for name, placed in placements.items():
        unlike_position = [j for j, expected in placed.items() if by_position.get(j) != expected]
        assert unlike_position, f"{name} attention places every tag where word positions would: {placed}"
