"""Sentence splitting: real news paragraphs against their hand-checked sentences, language tags, quotation marks."""

import json

import pytest
from paths import DATA

from nanomt.documents.sentences import DEFAULT_LANGUAGE, language_code, sentence_spans, split_sentences


def news_paragraphs(lang: str) -> list[list[str]]:
    """The committed sample's paragraphs, each as its list of true sentences (tests/data/README.md)."""
    lines = (DATA / f"news_paragraphs.{lang}").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["sentences"] for line in lines]


@pytest.mark.parametrize("lang", ["de", "en"])
def test_news_paragraphs_split_into_their_sentences(lang):
    paragraphs = news_paragraphs(lang)
    assert len(paragraphs) == 40 and all(len(p) >= 2 for p in paragraphs)
    recovered = sum(split_sentences(" ".join(p), lang) == p for p in paragraphs)
    assert recovered >= 0.9 * len(paragraphs), f"{recovered} of {len(paragraphs)} paragraphs split right"


@pytest.mark.parametrize(
    "tag, code",
    [
        ("de", "de"),
        ("DE", "de"),
        ("de-DE", "de"),
        ("de_AT.UTF-8", "de"),
        ("zh-Hans", "zh"),
        ("pt_BR", "pt"),
        ("fil", "fil"),
        ("auto", DEFAULT_LANGUAGE),
        ("", DEFAULT_LANGUAGE),
        (None, DEFAULT_LANGUAGE),
        ("german", DEFAULT_LANGUAGE),
        ("x", DEFAULT_LANGUAGE),
    ],
)
def test_language_code(tag, code):
    assert language_code(tag) == code


GERMAN = "Er wohnt seit dem 3. Oktober dort. Das ist z. B. gut."


def test_a_region_tag_gets_its_language_rules():
    german = ["Er wohnt seit dem 3. Oktober dort.", "Das ist z. B. gut."]
    assert split_sentences(GERMAN, "de") == german
    assert split_sentences(GERMAN, "de-AT") == german
    assert split_sentences(GERMAN, "en") != german  # English rules end a sentence at "3."


def test_an_unknown_language_gets_the_default_rules():
    text = "Hello there. How are you? Fine."
    assert split_sentences(text, "xx") == split_sentences(text, None) == ["Hello there.", "How are you?", "Fine."]


@pytest.mark.parametrize(
    "text, sentences",
    [
        # a quotation of several sentences
        (
            'Er sagte: "Das ist gut. Wir gehen jetzt." Dann ging er.',
            ['Er sagte: "Das ist gut.', 'Wir gehen jetzt."', "Dann ging er."],
        ),
        # one stray mark must not join the rest of the paragraph
        (
            'Ein " verirrtes Zeichen. Zweiter Satz. Dritter Satz.',
            ['Ein " verirrtes Zeichen.', "Zweiter Satz.", "Dritter Satz."],
        ),
        # an opening mark belongs to the sentence it opens, a closing one to the sentence it closes
        ("Das ist gut. „Wir gehen“, sagte er. Ende.", ["Das ist gut.", "„Wir gehen“, sagte er.", "Ende."]),
        ('"Hallo." "Tschüss."', ['"Hallo."', '"Tschüss."']),
        ("Il a dit « Non. Jamais. » Puis il partit.", ["Il a dit « Non.", "Jamais. »", "Puis il partit."]),
    ],
)
def test_quotation_marks(text, sentences):
    assert split_sentences(text, "de") == sentences


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \t "])
def test_blank_text_has_no_sentences(text):
    assert sentence_spans(text, "de") == []


@pytest.mark.parametrize("lang", ["de", "en"])
def test_spans_hold_every_character_and_only_whitespace_between(lang):
    texts = [" ".join(p) for p in news_paragraphs(lang)]
    texts += ['  "Ja." „Nein“ »Vielleicht.« ', "Ohne Punkt", "...", "?!", "a. b. c.", '"', 'x "', "  Satz.\t Satz 2.  "]
    for text in texts:
        spans = sentence_spans(text, lang)
        starts = [0] + [b for _, b in spans]
        ends = [a for a, _ in spans] + [len(text)]
        assert all(not text[e:s].strip() for e, s in zip(starts, ends)), text
        assert all(a < b and text[a:b] == text[a:b].strip() for a, b in spans), text
        assert "".join("".join(text[a:b].split()) for a, b in spans) == "".join(text.split()), text
