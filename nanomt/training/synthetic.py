"""The built-in toy languages: parallel sentences from a small made-up grammar, no download needed.

Three languages say the same things about ten nouns (cat, dog, bird, fish, king, girl, house, tree, river,
queen), six adjectives and ten verbs, but they say them differently. write_corpus writes a bilingual corpus
(source and target), write_multilingual_corpus one of all three (made-up codes xa, xb, xc: LANGUAGES) in every
direction. The source language is head-final: the verb ends its clause (subject-object-verb), a "that"-clause
("ke ...") comes before the verb that introduces it, and adjectives follow the noun. Nouns have a gender (-o
masculine, -a feminine; plurals -i, -e), the determiner agrees with the noun in gender and number (lo/la/li/le
"the", un/una/uni/une "a, some"; du/tre "two/three" do not inflect), adjectives agree in number (-ur, -uri) and
verbs with their subject (-at, -ant). The target language is subject-verb-object, puts adjectives before the
noun in mirrored order, adds -en to plural nouns and -et to verbs with a singular subject, has one word for
"the" (tha) and none for "some" (bare plurals). The third language is verb-initial (verb-subject-object, the
"that"-clause last), has no gender, marks plural nouns with the prefix ya-, puts "the" after the noun (na,
plural nei) and has no word for "a, some", puts the numerals (wani/keru) before the noun and invariable
adjectives after it, mirrored as in the target, and marks a plural subject on the verb by doubling its first
syllable (kita "sees", kikita "see"). A sentence is one clause, or two joined by "and"/"but" (e/ma, ond/bot,
oku/hena), and "that"-clauses ("ia" in the third language) nest two deep. Every sentence has exactly one
translation into each other language, so a perfect translator reaches 100 BLEU. For example ("the big happy
trees know that the queen chases the rivers"):

    source: le fese seruri beluri ke la zira le nuke lemat sabant.
    target: tha blek hask gliven kenn dat tha yent blanet tha morpen.
    third:  tatapo yawiru nei mohu lipo ia tulo rehina na yatawa nei.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice, permutations
from pathlib import Path

MIN_LEN, MAX_LEN = 3, 20  # words per sentence, "." included

# gloss: (source singular, source gender, target singular). Plurals: source -o -> -i, -a -> -e; target +en.
NOUNS = {
    "cat": ("piro", "m", "krob"),
    "dog": ("talo", "m", "dask"),
    "bird": ("musko", "m", "velm"),
    "fish": ("dreno", "m", "gorp"),
    "king": ("savo", "m", "hult"),
    "girl": ("rina", "f", "brin"),
    "house": ("mola", "f", "tash"),
    "tree": ("fesa", "f", "gliv"),
    "river": ("nuka", "f", "morp"),
    "queen": ("zira", "f", "yent"),
}
# gloss: (source stem, target word). Source adds -ur (singular) / -uri (plural); the target never inflects.
ADJECTIVES = {
    "big": ("bel", "blek"),
    "small": ("fos", "rud"),
    "red": ("kam", "grom"),
    "old": ("dun", "swil"),
    "happy": ("ser", "hask"),
    "quick": ("tav", "nork"),
}
# gloss: (source stem, target stem, kind); "tr" takes an object, "intr" nothing, "comp" a "that"-clause.
# Source adds -at / -ant for a singular / plural subject; the target adds -et for a singular subject.
VERBS = {
    "see": ("vid", "grep", "tr"),
    "eat": ("kor", "hov", "tr"),
    "chase": ("lem", "blan", "tr"),
    "like": ("pas", "stim", "tr"),
    "find": ("tir", "wark", "tr"),
    "sleep": ("dorm", "slom", "intr"),
    "sing": ("kant", "zing", "intr"),
    "say": ("dik", "sig", "comp"),
    "think": ("pens", "trov", "comp"),
    "know": ("sab", "kenn", "comp"),
}
SOURCE_DETERMINERS = {
    ("def", "m", "sg"): "lo",
    ("def", "f", "sg"): "la",
    ("def", "m", "pl"): "li",
    ("def", "f", "pl"): "le",
    ("indef", "m", "sg"): "un",
    ("indef", "f", "sg"): "una",
    ("indef", "m", "pl"): "uni",
    ("indef", "f", "pl"): "une",
}
# No ("indef", "pl") entry: the target uses a bare plural there, so that word has nothing to align to.
TARGET_DETERMINERS = {("def", "sg"): "tha", ("def", "pl"): "tha", ("indef", "sg"): "ek"}
# The closed classes by side: (source, target, third).
NUMERALS = {"two": ("du", "twa", "wani"), "three": ("tre", "thri", "keru")}  # plural only, no agreement
CONJUNCTIONS = {"and": ("e", "ond", "oku"), "but": ("ma", "bot", "hena")}
COMPLEMENTIZER = ("ke", "dat", "ia")
# The third language's open classes, by gloss, in tables of their own so the two-language tables above keep their
# shape. Plural nouns take THIRD_PLURAL; adjectives never inflect; a verb doubles its first syllable for a plural
# subject (every stem starts with a consonant and a vowel).
THIRD_NOUNS = {
    "cat": "miku",
    "dog": "hawe",
    "bird": "tiwi",
    "fish": "pelu",
    "king": "hotu",
    "girl": "lani",
    "house": "nohi",
    "tree": "wiru",
    "river": "tawa",
    "queen": "rehina",
}
THIRD_ADJECTIVES = {"big": "mohu", "small": "pike", "red": "wena", "old": "heko", "happy": "lipo", "quick": "sepa"}
THIRD_VERBS = {
    "see": "kita",
    "eat": "hamu",
    "chase": "tulo",
    "like": "pena",
    "find": "lavi",
    "sleep": "nemo",
    "sing": "huli",
    "say": "roka",
    "think": "sumi",
    "know": "tapo",
}
THIRD_PLURAL = "ya"
# "the" follows the noun. No "indef" entry: "a, some" is a bare noun, which also keeps every third-language
# sentence no longer than its target translation (each noun phrase has a word fewer or as many), so MAX_LEN holds.
THIRD_ARTICLES = {("def", "sg"): "na", ("def", "pl"): "nei"}
PERIOD = "."
MAX_DEPTH = 2  # "that"-clauses inside "that"-clauses, but no deeper


SIDES = ("src", "tgt", "third")
# The languages of a multilingual corpus: made-up codes (unassigned in ISO 639-1) for the sides.
LANGUAGES = {"xa": "src", "xb": "tgt", "xc": "third"}


def _side(side: str) -> int:
    """0 for "src", 1 for "tgt", 2 for "third": the index into the closed-class tables."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    return SIDES.index(side)


def _noun(gloss: str, number: str, side: str) -> str:
    """The noun's surface form."""
    if side == "third":
        return THIRD_PLURAL + THIRD_NOUNS[gloss] if number == "pl" else THIRD_NOUNS[gloss]
    src, _, tgt = NOUNS[gloss]
    if side == "tgt":
        return tgt + "en" if number == "pl" else tgt
    return src[:-1] + {"o": "i", "a": "e"}[src[-1]] if number == "pl" else src


def _adjective(gloss: str, number: str, side: str) -> str:
    """The adjective's surface form."""
    if side == "third":
        return THIRD_ADJECTIVES[gloss]
    src, tgt = ADJECTIVES[gloss]
    if side == "tgt":
        return tgt
    return src + ("uri" if number == "pl" else "ur")


def _verb(gloss: str, number: str, side: str) -> str:
    """The verb's surface form, agreeing with a subject of the given number."""
    if side == "third":
        stem = THIRD_VERBS[gloss]
        return stem[:2] + stem if number == "pl" else stem
    src, tgt, _ = VERBS[gloss]
    if side == "tgt":
        return tgt + "et" if number == "sg" else tgt
    return src + ("at" if number == "sg" else "ant")


def _determiner(np: dict, side: str) -> str | None:
    """The noun phrase's determiner or numeral; None where the language has no word (a bare noun)."""
    if np["det"] in NUMERALS:
        return NUMERALS[np["det"]][_side(side)]
    if side == "src":
        return SOURCE_DETERMINERS[np["det"], NOUNS[np["noun"]][1], np["number"]]
    if side == "tgt":
        return TARGET_DETERMINERS.get((np["det"], np["number"]))
    return THIRD_ARTICLES.get((np["det"], np["number"]))


def vocabulary(side: str) -> dict[str, tuple[str, ...]]:
    """Every word the language can produce, mapped to its analysis (category, gloss, features...)."""
    i = _side(side)
    words: dict[str, tuple[str, ...]] = {PERIOD: ("punct", PERIOD), COMPLEMENTIZER[i]: ("comp", "that")}
    words.update({forms[i]: ("conj", gloss) for gloss, forms in CONJUNCTIONS.items()})
    words.update({forms[i]: ("num", gloss) for gloss, forms in NUMERALS.items()})
    if side == "src":
        words.update({w: ("det", d, g, n) for (d, g, n), w in SOURCE_DETERMINERS.items()})
    elif side == "tgt":
        words.update({w: ("det", d) for (d, _), w in TARGET_DETERMINERS.items()})
    else:
        words.update({w: ("det", d, n) for (d, n), w in THIRD_ARTICLES.items()})
    for number in ("sg", "pl"):
        # Only the source has gender, and only its adjectives inflect (another language's adjective has one entry).
        gender = {g: (NOUNS[g][1],) if side == "src" else () for g in NOUNS}
        words.update({_noun(g, number, side): ("noun", g, *gender[g], number) for g in NOUNS})
        words.update({_verb(g, number, side): ("verb", g, number) for g in VERBS})
        adj_number = (number,) if side == "src" else ()
        words.update({_adjective(g, number, side): ("adj", g, *adj_number) for g in ADJECTIVES})
    return words


def _noun_phrase(rng: random.Random) -> dict:
    """A random noun phrase: noun, number, determiner and zero to two distinct adjectives."""
    number = "pl" if rng.random() < 0.4 else "sg"
    dets = ["def", "indef", "two", "three"] if number == "pl" else ["def", "indef"]
    det = rng.choices(dets, weights=[4, 3, 1.5, 1.5][: len(dets)])[0]
    n_adjs = rng.choices([0, 1, 2], weights=[5, 3, 2])[0]
    return {
        "noun": rng.choice(list(NOUNS)),
        "number": number,
        "det": det,
        "adjs": rng.sample(list(ADJECTIVES), n_adjs),
    }


def _clause(rng: random.Random, depth: int = 0) -> dict:
    """A random clause: subject, verb, and an object or a "that"-clause if the verb takes one."""
    kinds = ["tr", "intr", "comp"] if depth < MAX_DEPTH else ["tr", "intr"]
    kind = rng.choices(kinds, weights=[5, 2, 3][: len(kinds)])[0]
    clause = {"subj": _noun_phrase(rng), "verb": rng.choice([v for v, f in VERBS.items() if f[2] == kind])}
    if kind == "tr":
        clause["obj"] = _noun_phrase(rng)
    elif kind == "comp":
        clause["that"] = _clause(rng, depth + 1)
    return clause


def sample_sentence(rng: random.Random) -> dict:
    """A random abstract sentence (a small tree of dicts) whose realizations are at most MAX_LEN words."""
    while True:  # rejection keeps the length bound; it only trims the longest sentences
        clauses = [_clause(rng)]
        conj = None
        if rng.random() < 0.25:
            conj = rng.choice(list(CONJUNCTIONS))
            clauses.append(_clause(rng))
        tree = {"clauses": clauses, "conj": conj}
        if len(realize(tree, "src")) <= MAX_LEN and len(realize(tree, "tgt")) <= MAX_LEN:
            return tree


# Realizers return (word, node) pairs: node names the tree node the word expresses, so a source and a target
# word with the same node are translations of each other (the gold alignment).
def _realize_np(np: dict, side: str, node: str) -> list[tuple[str, str]]:
    """Determiner, noun and adjectives in the side's order."""
    det = _determiner(np, side)
    words = [] if det is None else [(det, node + ".det")]
    adjs = [(_adjective(a, np["number"], side), f"{node}.adj{i}") for i, a in enumerate(np["adjs"])]
    noun = [(_noun(np["noun"], np["number"], side), node + ".noun")]
    # Source: noun, then adjectives; target: adjectives mirrored before it ("cat red big" = "big red cat").
    if side != "third":
        return words + (noun + adjs if side == "src" else adjs[::-1] + noun)
    # Third: a numeral before the noun, "the" after it, then the adjectives mirrored ("cat the big red").
    return (words + noun if np["det"] in NUMERALS else noun + words) + adjs[::-1]


def _realize_clause(clause: dict, side: str, node: str) -> list[tuple[str, str]]:
    """Subject-object-verb for the source, subject-verb-object for the target, verb-subject-object for the third."""
    subj = _realize_np(clause["subj"], side, node + ".subj")
    verb = [(_verb(clause["verb"], clause["subj"]["number"], side), node + ".verb")]
    if "obj" in clause:
        rest = _realize_np(clause["obj"], side, node + ".obj")
    elif "that" in clause:
        that = [(COMPLEMENTIZER[_side(side)], node + ".comp")]
        rest = that + _realize_clause(clause["that"], side, node + ".that")
    else:
        rest = []
    if side == "src":
        return subj + rest + verb
    return subj + verb + rest if side == "tgt" else verb + subj + rest


def realize(tree: dict, side: str) -> list[tuple[str, str]]:
    """The sentence in one language as (word, node) pairs."""
    words = _realize_clause(tree["clauses"][0], side, "c0")
    if tree["conj"] is not None:
        words += [(CONJUNCTIONS[tree["conj"]][_side(side)], "conj")]
        words += _realize_clause(tree["clauses"][1], side, "c1")
    return words + [(PERIOD, "end")]


def _trees(seed: int) -> Iterator[dict]:
    """An endless, deterministic stream of abstract sentences."""
    rng = random.Random(seed)
    while True:
        yield sample_sentence(rng)


def _stream(seed: int) -> Iterator[tuple[list[tuple[str, str]], list[tuple[str, str]]]]:
    """An endless, deterministic stream of realized (source, target) sentences."""
    for tree in _trees(seed):
        yield realize(tree, "src"), realize(tree, "tgt")


def generate_aligned(n: int, seed: int = 0) -> list[tuple[list[str], list[str], list[tuple[int, int]]]]:
    """n (source words, target words, alignment) triples; alignment pairs are (source index, target index)."""
    out = []
    for src, tgt in islice(_stream(seed), n):
        position = {node: j for j, (_, node) in enumerate(tgt)}
        alignment = [(i, position[node]) for i, (_, node) in enumerate(src) if node in position]
        out.append(([w for w, _ in src], [w for w, _ in tgt], alignment))
    return out


def detokenize(words: list[str]) -> str:
    """Words as text, the final period attached as in real text (what sacreBLEU expects)."""
    return " ".join(words).replace(" " + PERIOD, PERIOD)


def generate_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (source, target) sentence pairs, deterministic for a given seed."""
    return [(detokenize(src), detokenize(tgt)) for src, tgt, _ in generate_aligned(n, seed)]


def write_corpus(
    out_dir: str | Path, pairs: int = 20000, seed: int = 0, valid: int = 500, test: int = 500
) -> dict[str, Path]:
    """Write train/valid/test .src/.tgt (one sentence a line) in out_dir; return {"train.src": path, ...}."""
    stream = ((detokenize([w for w, _ in s]), detokenize([w for w, _ in t])) for s, t in _stream(seed))
    # Held-out sentences are drawn first and unique; train then skips them, so no test sentence is memorized.
    held_out: set[str] = set()
    splits: dict[str, list[tuple[str, str]]] = {}
    for name, size in (("valid", valid), ("test", test)):
        splits[name] = []
        while len(splits[name]) < size:
            src, tgt = next(stream)
            if src not in held_out:
                held_out.add(src)
                splits[name].append((src, tgt))
    splits["train"] = []
    while len(splits["train"]) < pairs:
        src, tgt = next(stream)
        if src not in held_out:
            splits["train"].append((src, tgt))

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in ("train", "valid", "test"):
        for i, ext in enumerate(("src", "tgt")):
            path = out_dir / f"{name}.{ext}"
            path.write_text("".join(pair[i] + "\n" for pair in splits[name]), encoding="utf-8")
            paths[f"{name}.{ext}"] = path
    return paths


def _directions(directions: list[tuple[str, str]] | None) -> list[tuple[str, str]]:
    """The directions to write, checked: by default every ordered pair of distinct languages in LANGUAGES."""
    if directions is None:
        return list(permutations(LANGUAGES, 2))
    directions = [tuple(direction) for direction in directions]
    for direction in directions:
        if len(direction) != 2 or not set(direction) <= set(LANGUAGES) or direction[0] == direction[1]:
            raise ValueError(f"a direction is two different codes of {', '.join(LANGUAGES)}, got {direction!r}")
    if len(set(directions)) != len(directions):
        raise ValueError(f"a direction given twice in {directions!r}")
    return directions


def _multilingual_splits(
    seed: int, directions: list[tuple[str, str]], pairs_per_direction: int, valid: int, test: int
) -> dict[str, list[list[dict[str, str]]]]:
    """Each split's trees for each direction (in the order given), a tree as its sentences: {code: sentence}."""
    stream = (
        {code: detokenize([w for w, _ in realize(tree, side)]) for code, side in LANGUAGES.items()}
        for tree in _trees(seed)
    )
    # Held-out trees come first, unique, and the same for every direction (so scores compare across directions); a
    # later tree with any of their sentences, in any language, never reaches a train file.
    held_out: set[str] = set()
    splits = {}
    for name, size in (("valid", valid), ("test", test)):
        trees = []
        while len(trees) < size:
            tree = next(stream)
            if held_out.isdisjoint(tree.values()):
                held_out.update(tree.values())
                trees.append(tree)
        splits[name] = [trees] * len(directions)
    # Train trees are dealt to the directions in turn, so every direction says different things and a bigger
    # corpus only adds lines to each file.
    fresh = (tree for tree in stream if held_out.isdisjoint(tree.values()))
    splits["train"] = [[] for _ in directions]
    for _ in range(pairs_per_direction):
        for trees in splits["train"]:
            trees.append(next(fresh))
    return splits


def write_multilingual_corpus(
    out_dir: str | Path,
    pairs_per_direction: int = 20000,
    seed: int = 0,
    valid: int = 500,
    test: int = 500,
    directions: list[tuple[str, str]] | None = None,
) -> dict[str, Path]:
    """Write a corpus of the three languages in out_dir, one sentence a line: for each direction (("xa", "xb"):
    from LANGUAGES' codes; by default all six) {split}.{src}-{tgt}.{src} and {split}.{src}-{tgt}.{tgt}, e.g.
    train.xa-xc.xa and train.xa-xc.xc. Every direction's valid and test files hold the same held-out trees, none of
    whose sentences is in any train file. Return {"train.xa-xc.xa": path, ...}; deterministic for a seed (valid
    and test hold write_corpus's sentences for the same seed and sizes)."""
    directions = _directions(directions)
    splits = _multilingual_splits(seed, directions, pairs_per_direction, valid, test)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in ("train", "valid", "test"):
        for (src, tgt), trees in zip(directions, splits[name], strict=True):
            for code in (src, tgt):
                path = out_dir / f"{name}.{src}-{tgt}.{code}"
                path.write_text("".join(tree[code] + "\n" for tree in trees), encoding="utf-8")
                paths[path.name] = path
    return paths
