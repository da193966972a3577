"""Documents: paragraphs in their shape, long lines in pieces, pass-through spans, unknown pieces, alternatives."""

import io
import json
import random
import re

import numpy as np
import pytest
import sentencepiece as spm
from paths import DATA

from nanomt.decoding.pieces import join_pieces, replace_unknowns
from nanomt.documents.segmentation import (
    Segmentation,
    alternatives,
    join_hypotheses,
    pass_through_spans,
    segment,
    translate_texts,
)

# What separates sentences inside a paragraph, and paragraphs, in the documents built from the news sample.
SENTENCE_GAPS = [" ", " ", " ", "  ", "\t"]
PARAGRAPH_GAPS = ["\n", "\n\n", "\n\n\n", "\r\n", " \n\n", "\n \n"]


def news_paragraphs(lang: str) -> list[list[str]]:
    lines = (DATA / f"news_paragraphs.{lang}").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["sentences"] for line in lines]


def per_unit(fn):
    """A translate function for translate_texts that maps each unit through `fn`, one hypothesis a unit."""
    return lambda units: [[(fn(u), 0.0)] for u in units]


def marked(sentence: str) -> str:
    """A fake translation that shows where each unit began and ended."""
    return f"⟨{sentence[::-1]}⟩"


def build_document(paragraphs: list[list[str]], seed: int) -> tuple[str, list[str], list[str], list[str]]:
    """A document of the paragraphs in varied whitespace; their texts, expected translations and separators."""
    # The document is "  ", then each paragraph and its separator; a paragraph's translation marks each sentence.
    rng = random.Random(seed)
    texts, expected = [], []
    for sentences in paragraphs:
        gaps = [rng.choice(SENTENCE_GAPS) for _ in sentences[1:]] + [""]
        texts.append("".join(s + g for s, g in zip(sentences, gaps)))
        expected.append("".join(marked(s) + g for s, g in zip(sentences, gaps)))
    seps = [rng.choice(PARAGRAPH_GAPS) for _ in paragraphs[1:]] + ["\n"]
    return "  " + "".join(t + s for t, s in zip(texts, seps)), texts, expected, seps


@pytest.mark.parametrize("lang", ["de", "en"])
def test_news_paragraphs_translate_as_their_sentences_one_by_one(lang):
    doc, texts, expected, seps = build_document(news_paragraphs(lang), seed=1)
    got = [t.text for t in translate_texts(texts, per_unit(marked), lang)]
    same = sum(g == e for g, e in zip(got, expected))
    assert same >= 0.9 * len(texts), f"{same} of {len(texts)} paragraphs translate as their sentences"
    # The whole document: each paragraph as it came out alone, every line break and blank line in place.
    whole = translate_texts([doc], per_unit(marked), lang)[0].text
    assert whole == "  " + "".join(g + s for g, s in zip(got, seps))


@pytest.mark.parametrize("lang", ["de", "en"])
def test_document_structure_comes_back_exactly(lang):
    doc, *_ = build_document(news_paragraphs(lang), seed=2)
    assert not pass_through_spans(doc)  # the sample has none: every letter is in a unit
    seg = segment(doc, lang)
    assert seg.join(list(seg.units)) == doc
    # A translation that changes every letter of every unit and nothing else: only the units may change.
    assert translate_texts([doc], per_unit(str.swapcase), lang)[0].text == doc.swapcase()


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \t\n ", "😀", " 😀 \n", "https://example.com", "— 42 —"])
def test_text_without_words_comes_back_as_it_is_untranslated(text):
    def never(units):
        raise AssertionError(f"nothing to translate, yet asked for {units}")

    [result] = translate_texts([text], never, "de")
    assert (result.text, result.score, result.alternatives, result.cut) == (text, 0.0, (), False)


# Long lines ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def count_tokens():
    """Token counts by a small SentencePiece BPE model trained on the news sample (non-additive across pieces)."""
    sentences = [s for lang in ("de", "en") for p in news_paragraphs(lang) for s in p]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        model_type="bpe",
        vocab_size=400,
        character_coverage=1.0,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return lambda texts: [len(ids) for ids in sp.encode(list(texts))]


def long_line(count_tokens, kind: str, tokens: int = 5000) -> str:
    """One sentence of at least `tokens` tokens of news text: "clauses", "words" (no punctuation), "letters"."""
    sentences = [s for p in news_paragraphs("de") for s in p]
    parts, n, i = [], 0, 0
    while n < tokens:
        s = sentences[i % len(sentences)]
        i += 1
        if kind == "clauses":
            s = re.sub(r"[.!?;:,\"„“]", "", s)
        else:
            s = re.sub(r"[^\w\s]", "", s)
            s = s.replace(" ", "") if kind == "letters" else s
        parts.append(s)
        n = count_tokens([(", " if kind == "clauses" else " " if kind == "words" else "").join(parts)])[0]
    return (", " if kind == "clauses" else " " if kind == "words" else "").join(parts) + "."


@pytest.mark.parametrize("kind, budget", [("clauses", 127), ("words", 63), ("letters", 63), ("letters", 255)])
def test_a_5000_token_line_is_translated_in_pieces_within_the_budget(count_tokens, kind, budget):
    line = long_line(count_tokens, kind)
    assert count_tokens([line])[0] >= 5000
    seg = segment(line, "de", max_tokens=budget, count_tokens=count_tokens)
    assert len(seg.units) > 5000 / budget and seg.cut == (0,) and set(seg.sentence_of) == {0}
    assert max(count_tokens(list(seg.units))) <= budget
    assert seg.join(list(seg.units)) == line
    expected_gap = {"clauses": " ", "words": " ", "letters": ""}[kind]
    assert set(seg.gaps[1:-1]) == {expected_gap}
    [result] = translate_texts([line], per_unit(marked), "de", max_tokens=budget, count_tokens=count_tokens)
    assert result.cut
    assert all(marked(u) in result.text for u in seg.units)
    assert result.text == seg.join([marked(u) for u in seg.units])


def test_a_long_line_is_cut_at_clause_ends_into_as_few_pieces_as_fit(count_tokens):
    budget = 127
    line = long_line(count_tokens, "clauses")
    clauses = line[:-1].split(", ")
    assert max(count_tokens(clauses)) < budget
    seg = segment(line, "de", max_tokens=budget, count_tokens=count_tokens)
    assert all(u.endswith(",") for u in seg.units[:-1])
    # greedy: no piece could have taken the next clause as well
    for unit, following in zip(seg.units, seg.units[1:]):
        next_clause = following.split(", ")[0]
        assert count_tokens([f"{unit} {next_clause},"])[0] > budget


def test_pieces_stay_within_a_budget_on_random_text():
    rng = random.Random(0)
    alphabet = [
        "ab",
        "cde",
        "f",
        " ",
        " ",
        "  ",
        "\n",
        ".",
        ",",
        ";",
        "!",
        "?",
        '"',
        "`",
        "@",
        "😀",
        "://",
        "www.",
        "x",
    ]
    chars = lambda texts: [len(t) for t in texts]  # noqa: E731  # a character a token: not additive over spaces
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        budget = rng.randint(1, 9)
        seg = segment(text, "en", max_tokens=budget, count_tokens=chars)
        assert seg.join(list(seg.units)) == text
        assert all(u == u.strip() and any(c.isalpha() for c in u) and len(u) <= budget for u in seg.units), text


# Pass-through spans ----------------------------------------------------------------------------------------------

SPANS = [
    "https://example.com/a/b.html?x=1&y=2#frag",
    "http://localhost:8000/translate",
    "www.example.org/news",
    "https://de.wikipedia.org/wiki/Berlin_(Begriffsklärung)",
    "ftp://files.example.net/pub/",
    "max.mustermann@firma.de",
    "a_b+c@mail.example.co.uk",
    "`x = f(y)`",
    "``code with ` inside``",
    "`--beam 5`",
    "😀",
    "👍🏽",
    "👨\u200d👩\u200d👧",
    "🇩🇪",
    "1\ufe0f\u20e3",
    "❤\ufe0f",
    "😀😂",
]
# How a span sits in its sentence: between words, in parentheses, before the full stop, after a colon.
PLACES = ["{} ", "({}) ", "<{}> ", "„{}“ ", "{}, "]


def with_spans(sentence: str, rng: random.Random) -> tuple[str, list[str]]:
    """`sentence` with 1-3 spans put in at word boundaries, and the spans in order."""
    words = sentence.split(" ")
    slots = sorted(rng.sample(range(len(words) + 1), k=min(len(words) + 1, rng.randint(1, 3))))
    out, spans, last = [], [], 0
    for slot in slots:
        out.append(" ".join(words[last:slot]) + (" " if 0 < slot else ""))
        span = rng.choice(SPANS)
        out.append(rng.choice(PLACES).format(span))
        spans.append(span)
        last = slot
    text = ("".join(out) + " ".join(words[last:])).rstrip()
    if rng.random() < 0.3:  # a span that ends the sentence, before its full stop
        span = rng.choice(SPANS)
        text = text.rstrip(".!?") + " " + span + "."
        spans.append(span)
    return text, spans


def span_cases(n: int = 300) -> list[tuple[str, list[str]]]:
    rng = random.Random(34)
    sentences = [s for lang in ("de", "en") for p in news_paragraphs(lang) for s in p]
    return [with_spans(rng.choice(sentences), rng) for _ in range(n)]


def test_pass_through_spans_are_found_exactly():
    for text, spans in span_cases():
        assert [text[a:b] for a, b in pass_through_spans(text)] == spans, text


def test_pass_through_spans_come_back_byte_identical():
    cases = span_cases()
    # A translation that changes every unit's letters: a span that went through the model would not come back.
    results = translate_texts([t for t, _ in cases], per_unit(str.upper), "de")
    for (text, spans), result in zip(cases, results):
        pos = 0
        for span in spans:
            at = result.text.find(span, pos)
            assert at >= 0, f"{span!r} lost from {text!r}: {result.text!r}"
            pos = at + len(span)
        assert result.text.upper() == text.upper()


def test_an_emoji_ends_no_sentence_and_no_translation():
    seg = segment("Heute 😀 gehen wir nach Hause. Morgen nicht.", "de")
    assert seg.units == ("Heute", "gehen wir nach Hause.", "Morgen nicht.")
    assert seg.sentence_of == (0, 0, 1)
    [result] = translate_texts(["Heute 😀 gehen wir nach Hause."], per_unit(marked), "de")
    assert result.text == f"{marked('Heute')} 😀 {marked('gehen wir nach Hause.')}"


def test_a_url_ends_no_sentence():
    text = "Siehe https://example.com/a.b. Dann www.example.org/x?y=1. Ende."
    assert segment(text, "de").units == ("Siehe", "Dann", "Ende.")
    assert segment(text, "de").sentence_of == (0, 1, 2)


# Unknown pieces --------------------------------------------------------------------------------------------------


def test_replace_unknowns_takes_the_source_piece_attended_to_most():
    src = ["▁Das", "▁", "😀", "▁ist", "▁toll", "</s>"]
    tgt = ["▁That", "▁", "<unk>", "▁is", "▁great", "</s>"]
    attention = np.array(
        [  # per target piece (row), weights over the source pieces (columns)
            [0.9, 0.0, 0.0, 0.0, 0.0, 0.1],
            [0.1, 0.6, 0.2, 0.0, 0.0, 0.1],
            [0.1, 0.05, 0.3, 0.05, 0.0, 0.5],  # </s> has the most, but is never the answer
            [0.0, 0.0, 0.1, 0.8, 0.0, 0.1],
            [0.0, 0.0, 0.0, 0.1, 0.8, 0.1],
            [0.0, 0.0, 0.0, 0.0, 0.1, 0.9],
        ]
    )
    pieces = replace_unknowns(src, tgt, attention)
    assert pieces == ["▁That", "▁", "😀", "▁is", "▁great", "</s>"]
    assert join_pieces(pieces) == "That 😀 is great"


def test_an_unknown_source_piece_no_target_unk_took_goes_where_the_attention_puts_it():
    src = ["▁Preis", ":", "▁5", "€", "▁und", "▁", "Ω", "</s>"]
    tgt = ["▁Price", ":", "▁5", "<unk>", "▁and", "</s>"]
    attention = np.full((6, 8), 0.01)
    for row, col in [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 7)]:
        attention[row, col] = 0.5
    attention[5, 6] = 0.3  # Ω: most attended to by </s>'s row, of all rows
    pieces = replace_unknowns(src, tgt, attention, src_unknown=[3, 6])
    assert pieces == ["▁Price", ":", "▁5", "€", "▁and", "▁Ω", "</s>"]
    assert join_pieces(pieces) == "Price: 5€ and Ω"
    # inside a word (no ▁ before it), it is put in as it is
    mid = replace_unknowns(["▁ab", "Ω", "cd", "</s>"], ["▁ab", "cd", "</s>"], np.eye(3, 4) * 0.9, src_unknown=[1])
    assert mid == ["▁ab", "Ω", "cd", "</s>"] and join_pieces(mid) == "abΩcd"


def test_replace_unknowns_checks_the_attention_shape():
    with pytest.raises(ValueError, match="attention is"):
        replace_unknowns(["▁a", "</s>"], ["<unk>", "</s>"], np.zeros((2, 3)))


# Alternatives and scores -----------------------------------------------------------------------------------------


def test_join_hypotheses_ranks_every_unit_together():
    seg = segment("Eins. Zwei.\n", "de")
    assert (seg.units, seg.gaps) == (("Eins.", "Zwei."), ("", " ", "\n"))
    n_best = [[("One.", -1.0), ("1.", -2.0), ("Uno.", -3.0)], [("Two.", -0.5)]]
    assert join_hypotheses(seg, n_best) == [("One. Two.\n", -1.5), ("1. Two.\n", -2.5), ("Uno. Two.\n", -3.5)]


def test_alternatives_skip_the_best_and_repeats():
    assert alternatives(["a", "b", "a", "c", "b", "d"], 2) == ["b", "c"]
    assert alternatives(["a", "b", "a", "c", "b", "d"], 9) == ["b", "c", "d"]
    assert alternatives(["a", "b"], 0) == []
    with pytest.raises(ValueError, match="alternatives must be >= 0"):
        alternatives(["a"], -1)


def test_translate_texts_returns_alternatives_and_scores():
    table = {"Eins.": [("One.", -1.0), ("1.", -2.0)], "Zwei.": [("Two.", -0.5), ("2.", -0.7), ("Two.", -0.9)]}
    calls = []

    def n_best(units):
        calls.append(units)
        return [table[u] for u in units]

    results = translate_texts(["Eins. Zwei.", "Zwei.", ""], n_best, "de", n_alternatives=3)
    assert calls == [["Eins.", "Zwei.", "Zwei."]]  # every unit of every text in one call
    assert [(r.text, r.score, r.alternatives, r.cut) for r in results] == [
        ("One. Two.", -1.5, ("1. 2.", "1. Two."), False),
        ("Two.", -0.5, ("2.",), False),
        ("", 0.0, (), False),
    ]


# Bad input -------------------------------------------------------------------------------------------------------


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="a text must be a string, not NoneType"):
        segment(None)
    with pytest.raises(ValueError, match="max_tokens must be >= 1 and come with count_tokens"):
        segment("Text.", max_tokens=10)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        segment("Text.", max_tokens=0, count_tokens=lambda ts: [1] * len(ts))
    with pytest.raises(ValueError, match="1 translations for 2 units"):
        segment("Eins. Zwei.").join(["One."])
    with pytest.raises(ValueError, match="one gap more than units"):
        Segmentation(units=("a",), gaps=("",), sentence_of=(0,), cut=())
    with pytest.raises(ValueError, match="translate returned 0 results for 1 units"):
        translate_texts(["Text."], lambda units: [])
