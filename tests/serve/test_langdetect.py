"""Language detection (nanomt.serve.langdetect) against lingua's own answers: restricted to the candidates, in
LibreTranslate's shape, loaded once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

lingua = pytest.importorskip("lingua")

from nanomt.serve import langdetect  # noqa: E402
from nanomt.serve.langdetect import LanguageDetectionError, detect, detectable  # noqa: E402

SERVED = ["de", "en", "fr", "cs"]
# Written for these tests: one everyday sentence per language, and a few words.
SENTENCES = {
    "de": ["Der Zug nach Berlin hat heute leider zwanzig Minuten Verspätung.", "Guten Morgen zusammen"],
    "en": ["The train to London is running twenty minutes late today.", "Good morning everyone"],
    "fr": ["Le train pour Paris a vingt minutes de retard aujourd'hui.", "Bonjour à tous"],
    "cs": ["Vlak do Prahy má dnes bohužel dvacet minut zpoždění.", "Dobré ráno všem"],
}


def lingua_own(text: str, codes: list[str]) -> dict[str, float]:
    """lingua's confidence values for a detector of exactly these languages, as percentages."""
    languages = [lingua.Language.from_iso_code_639_1(lingua.IsoCode639_1.from_str(c)) for c in codes]
    detector = lingua.LanguageDetectorBuilder.from_languages(*languages).build()
    values = detector.compute_language_confidence_values(text)
    return {v.language.iso_code_639_1.name.lower(): 100 * v.value for v in values}


@pytest.mark.parametrize("candidates", [SERVED, ["de", "en"], ["fr", "cs", "en"]])
def test_confidences_are_lingua_s_own_for_the_candidates(candidates):
    for texts in SENTENCES.values():
        for text in texts:
            got = detect(text, candidates)
            ref = lingua_own(text, candidates)
            assert [c for c, _ in got] == sorted(candidates, key=lambda c: (-round(ref[c], 2), candidates.index(c)))
            assert all(conf == round(ref[code], 2) for code, conf in got)
            assert sum(conf for _, conf in got) == pytest.approx(100, abs=0.05)


@pytest.mark.parametrize("lang", SERVED)
def test_each_served_language_is_found(lang):
    for text in SENTENCES[lang]:
        assert detect(text, SERVED)[0][0] == lang, text


def test_only_candidates_are_answered():
    """French text on a German and English server is German or English, never French."""
    for text in SENTENCES["fr"]:
        assert {c for c, _ in detect(text, ["de", "en"])} == {"de", "en"}


def test_served_codes_map_to_their_language():
    text = SENTENCES["de"][0]
    got = dict(detect(text, ["de-AT", "en_US", "pb"]))
    ref = lingua_own(text, ["de", "en", "pt"])
    assert got == {"de-AT": round(ref["de"], 2), "en_US": round(ref["en"], 2), "pb": round(ref["pt"], 2)}
    # Two served codes of one language share its confidence.
    got = detect(SENTENCES["en"][0], ["en", "de", "en-GB"])
    assert [c for c, _ in got][:2] == ["en", "en-GB"] and got[0][1] == got[1][1]


def test_what_cannot_be_detected():
    assert detectable(["de", "src", "tgt", "pt-BR", "zt", "deu", "xx"]) == ["de", "pt-BR", "zt", "deu"]
    # A language the detector does not know is left out; one candidate needs no detection.
    assert [c for c, _ in detect(SENTENCES["de"][0], ["de", "src", "en"])] == ["de", "en"]
    assert detect("anything at all", ["src"]) == [("src", 100.0)]
    assert detect(" 42 !? ", SERVED) == [] and detect("", ["de"]) == []
    with pytest.raises(LanguageDetectionError, match="^cannot tell src, tgt apart: no language the detector knows$"):
        detect("Hallo", ["src", "tgt"])
    with pytest.raises(LanguageDetectionError, match="no candidate languages"):
        detect("Hallo", [])


def test_one_detector_per_set_of_languages_built_once(monkeypatch):
    builds = []

    class CountedBuilder:
        @staticmethod
        def from_languages(*languages):
            builds.append(languages)
            return lingua.LanguageDetectorBuilder.from_languages(*languages)

    counted = SimpleNamespace(**{n: getattr(lingua, n) for n in ("Language", "IsoCode639_1", "IsoCode639_3")})
    counted.LanguageDetectorBuilder = CountedBuilder
    monkeypatch.setattr(langdetect, "_lingua", lambda: counted)
    langdetect._detector.cache_clear()
    for text in SENTENCES["cs"] * 3:
        detect(text, SERVED)
        detect(text, list(reversed(SERVED)))  # the same languages in another order: the same detector
    langdetect.preload(SERVED)
    assert len(builds) == 1
    detect(SENTENCES["cs"][0], ["cs", "de"])
    assert len(builds) == 2
    langdetect._detector.cache_clear()
