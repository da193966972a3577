"""Language codes: the one pattern a code fits, the language a tag names, the languages nanomt names, and the
language pair of a run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanomt.core.config import DataConfig

# A code is a language (ISO 639-1 or 639-3) and at most one subtag (region, script): "de", "eng", "pt-BR", "zh_Hant".
LANGUAGE = r"[A-Za-z]{2,3}"
SUBTAG = r"[A-Za-z0-9]{2,8}"
CODE = rf"{LANGUAGE}(?:[-_]{SUBTAG})?"
# A code inside "SRC-TGT" (nanomt serve's `de-en=RUN`): '-' separates the pair, so a subtag follows '_' there.
PAIR_CODE = rf"{LANGUAGE}(?:_{SUBTAG})?"
LANGUAGE_CODE = re.compile(CODE)
# The language that starts a BCP 47 or POSIX locale tag: "de" in "de", "DE", "de-DE", "de_AT.UTF-8", "zh-Hans".
_BASE = re.compile(rf"{LANGUAGE}(?=$|[-_.@])")
# The code a config gives a multilingual corpus (tgt_lang), written in its target-language token: >>fra<<, >>pt_br<<.
TOKEN_CODE = re.compile(r"[A-Za-z0-9_-]{1,16}")
# Training files named train.src/train.tgt have these suffixes: they fit the pattern but name no language. A caller
# that needs names for a run without a pair uses them (a server lists the toy pair as src-tgt).
PLACEHOLDERS = ("src", "tgt")

# The languages nanomt names: ISO 639-1 code, ISO 639-3 code (opus-mt's multilingual models write either in their
# >>xx<< tokens), English name (LibreTranslate's /languages, the page).
LANGUAGES = (
    ("ar", "ara", "Arabic"), ("bg", "bul", "Bulgarian"), ("ca", "cat", "Catalan"), ("cs", "ces", "Czech"),
    ("da", "dan", "Danish"), ("de", "deu", "German"), ("el", "ell", "Greek"), ("en", "eng", "English"),
    ("es", "spa", "Spanish"), ("et", "est", "Estonian"), ("fi", "fin", "Finnish"), ("fr", "fra", "French"),
    ("ga", "gle", "Irish"), ("gl", "glg", "Galician"), ("he", "heb", "Hebrew"), ("hi", "hin", "Hindi"),
    ("hr", "hrv", "Croatian"), ("hu", "hun", "Hungarian"), ("id", "ind", "Indonesian"), ("it", "ita", "Italian"),
    ("ja", "jpn", "Japanese"), ("ko", "kor", "Korean"), ("la", "lat", "Latin"), ("lt", "lit", "Lithuanian"),
    ("lv", "lav", "Latvian"), ("nl", "nld", "Dutch"), ("no", "nor", "Norwegian"), ("pl", "pol", "Polish"),
    ("pt", "por", "Portuguese"), ("ro", "ron", "Romanian"), ("ru", "rus", "Russian"), ("sk", "slk", "Slovak"),
    ("sl", "slv", "Slovenian"), ("sv", "swe", "Swedish"), ("tr", "tur", "Turkish"), ("uk", "ukr", "Ukrainian"),
    ("zh", "zho", "Chinese"),
)  # fmt: skip
LANGUAGE_NAMES = {short: name for short, _, name in LANGUAGES}
_SHORT = {long: short for short, long, _ in LANGUAGES}


def served_code(code: str) -> str:
    """The code a server lists a language by, as LibreTranslate's clients ask for it: ISO 639-1 for a 639-3 code
    nanomt names ('fra' -> 'fr'), else the code as it is ('fr', 'pt_br', 'fur')."""
    return _SHORT.get(code.lower(), code)


def is_code(text: str) -> bool:
    """Whether `text` is a language code as nanomt takes them: 'de', 'eng', 'pt-BR'; not 'German' or 'de/x'."""
    return LANGUAGE_CODE.fullmatch(text) is not None


def base_code(tag: str | None) -> str | None:
    """The language a code or locale tag names, in lower case: 'de-DE', 'de_AT.UTF-8' -> 'de'; None for text that
    starts with no code ('auto', 'german', '', None)."""
    match = _BASE.match((tag or "").strip())
    return None if match is None else match.group(0).lower()


def language_pair(data: DataConfig) -> tuple[str, str] | None:
    """A run's (source, target) codes, from its data section: the Hugging Face dataset's src_lang/tgt_lang, else the
    suffixes of its training files (train.de, train.en) when every corpus has the same two. None unless the two
    differ, fit the code pattern and are no placeholders (train.src, train.tgt; a dataset's column names)."""
    if data.hf is not None:
        pair = (data.hf.src_lang, data.hf.tgt_lang)
    else:
        corpora = data.train if isinstance(data.train, tuple) else (data.train,)
        pairs = {(Path(c.src).suffix[1:], Path(c.tgt).suffix[1:]) for c in corpora if c.src and c.tgt}
        if len(pairs) != 1:  # none (a TSV), or corpora that disagree
            return None
        [pair] = pairs
    source, target = pair
    if source == target or not all(is_code(c) and c not in PLACEHOLDERS for c in pair):
        return None
    return source, target
