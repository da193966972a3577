"""The built-in toy language pair: determinism, corpus files, and a grammar that is what it claims."""

import hashlib
import random
from collections import defaultdict

import pytest

from nanomt.training import synthetic
from nanomt.training.synthetic import (
    ADJECTIVES,
    LANGUAGES,
    NOUNS,
    VERBS,
    generate_aligned,
    generate_pairs,
    realize,
    sample_sentence,
    vocabulary,
    write_corpus,
    write_multilingual_corpus,
)

SRC_VOCAB, TGT_VOCAB = vocabulary("src"), vocabulary("tgt")


def words(text: str) -> list[str]:
    """The words of a toy sentence, the attached final period as its own word."""
    return text.replace(synthetic.PERIOD, " " + synthetic.PERIOD).split()


@pytest.fixture(scope="module")
def pairs():
    return generate_pairs(20000, seed=0)


@pytest.fixture(scope="module")
def trees():
    rng = random.Random(1)
    return [sample_sentence(rng) for _ in range(2000)]


def test_deterministic_per_seed_and_leaves_global_random_alone():
    state = random.getstate()
    a = generate_pairs(300, seed=0)
    assert random.getstate() == state
    assert a == generate_pairs(300, seed=0)
    assert a[:50] == generate_pairs(50, seed=0)
    assert a != generate_pairs(300, seed=1)


def test_lengths_in_range_and_varied(pairs):
    for side in (0, 1):
        lengths = [len(words(p[side])) for p in pairs]
        assert min(lengths) >= synthetic.MIN_LEN and max(lengths) <= synthetic.MAX_LEN
        assert min(lengths) <= 4 and max(lengths) == synthetic.MAX_LEN
        assert 8 <= sum(lengths) / len(lengths) <= 12
    assert all(s.endswith(".") and not s.endswith(" .") and t.endswith(".") and not t.endswith(" .") for s, t in pairs)


def test_vocabulary_sizes_and_coverage(pairs):
    # A collision between two forms would shrink the dict below the count the tables imply.
    assert len(SRC_VOCAB) == 2 * (len(NOUNS) + len(ADJECTIVES) + len(VERBS)) + 8 + 2 + 2 + 1 + 1
    assert len(TGT_VOCAB) == 2 * (len(NOUNS) + len(VERBS)) + len(ADJECTIVES) + 2 + 2 + 2 + 1 + 1
    for vocab, side in ((SRC_VOCAB, 0), (TGT_VOCAB, 1)):
        assert 40 <= len(vocab) <= 80
        used = {w for p in pairs[:5000] for w in words(p[side])}
        assert used == set(vocab)
        assert all(w.isascii() and (w.isalpha() and w.islower() or w == ".") for w in vocab)
    # The languages share no content words, so a model cannot get away with copying.
    content = {w for w, a in SRC_VOCAB.items() if a[0] in ("noun", "adj", "verb")}
    assert not content & set(TGT_VOCAB)


def test_source_to_target_is_a_function(pairs):
    seen = {}
    for src, tgt in pairs:
        assert seen.setdefault(src, tgt) == tgt, src
    assert len(seen) > 15000  # and the sample is not mostly duplicates


def test_source_agreement(trees):
    checked = defaultdict(int)
    for tree in trees:
        words = {node: SRC_VOCAB[w] for w, node in realize(tree, "src")}
        for node, analysis in words.items():
            np, _, part = node.rpartition(".")
            if part == "noun":
                _, _, gender, number = analysis
                det = words[np + ".det"]
                if det[0] == "det":  # numerals do not inflect
                    assert det[2:] == (gender, number), node
                    checked["det"] += 1
                adjs = [a for n, a in words.items() if n.startswith(np + ".adj")]
                assert all(a[2] == number for a in adjs)
                checked["adj"] += len(adjs)
            elif part == "verb":
                assert analysis[2] == words[np + ".subj.noun"][3], node
                checked["verb"] += 1
    assert min(checked.values()) > 1000


def test_agreement_means_one_target_word_has_several_source_forms():
    sources = defaultdict(set)
    for src, tgt, alignment in generate_aligned(3000, seed=2):
        for i, j in alignment:
            sources[tgt[j]].add(src[i])
    assert sources["tha"] == {"lo", "la", "li", "le"}
    for gloss, (stem, word) in ADJECTIVES.items():
        assert sources[word] == {stem + "ur", stem + "uri"}, gloss
    for gloss, (_, stem, _) in VERBS.items():
        assert len(sources[stem]) == 1 and len(sources[stem + "et"]) == 1, gloss
        assert sources[stem] != sources[stem + "et"]


def test_alignment_links_translations():
    for src, tgt, alignment in generate_aligned(2000, seed=3):
        assert sorted(j for _, j in alignment) == list(range(len(tgt)))  # every target word has one source
        aligned = {i for i, _ in alignment}
        # Only "some" (uni/une) has no target word: the target uses a bare plural.
        assert {src[i] for i in range(len(src)) if i not in aligned} <= {"uni", "une"}
        for i, j in alignment:
            a, b = SRC_VOCAB[src[i]], TGT_VOCAB[tgt[j]]
            assert a[:2] == b[:2], (src[i], tgt[j])  # same category and meaning
            if a[0] in ("noun", "verb"):
                assert a[-1] == b[-1], (src[i], tgt[j])  # same number


def test_word_order_differs(trees):
    crossing = 0
    for tree in trees:
        src, tgt = realize(tree, "src"), realize(tree, "tgt")
        for words, verb_final in ((src, True), (tgt, False)):
            position = {node: i for i, (_, node) in enumerate(words)}
            for node, i in position.items():
                clause, _, part = node.rpartition(".")
                if part == "verb":
                    inside = [j for n, j in position.items() if n.startswith(clause + ".")]
                    subj_end = max(j for n, j in position.items() if n.startswith(clause + ".subj."))
                    # Source: the verb ends its clause (SOV); target: it follows the subject (SVO).
                    assert i == (max(inside) if verb_final else subj_end + 1), (words, node)
                elif part.startswith("adj"):
                    # Source adjectives follow the noun, target adjectives precede it.
                    assert (i > position[clause + ".noun"]) == verb_final
        tgt_position = {node: j for j, (_, node) in enumerate(tgt)}
        aligned = [tgt_position[node] for _, node in src if node in tgt_position]
        crossing += aligned != sorted(aligned)
    assert crossing > 0.8 * len(trees)  # almost every pair needs a non-monotonic alignment


def test_write_corpus(tmp_path):
    paths = write_corpus(tmp_path / "toy", pairs=400, seed=5, valid=60, test=70)
    names = [f"{s}.{e}" for s in ("train", "valid", "test") for e in ("src", "tgt")]
    assert sorted(paths) == sorted(names) and all(paths[n] == tmp_path / "toy" / n for n in names)
    lines = {}
    for name, path in paths.items():
        text = path.read_text(encoding="utf-8")
        assert text.endswith("\n") and "\n\n" not in text
        lines[name] = text.splitlines()
        assert all(line.strip() == line and line for line in lines[name])
    for split, size in (("train", 400), ("valid", 60), ("test", 70)):
        assert len(lines[f"{split}.src"]) == len(lines[f"{split}.tgt"]) == size
    train, valid, test = (set(lines[f"{s}.src"]) for s in ("train", "valid", "test"))
    assert len(valid) == 60 and len(test) == 70
    assert not train & valid and not train & test and not valid & test
    # The same sentences a generator gives, just split three ways.
    mapping = dict(generate_pairs(3000, seed=5))
    for split in ("train", "valid", "test"):
        assert all(mapping[s] == t for s, t in zip(lines[f"{split}.src"], lines[f"{split}.tgt"], strict=True))
    again = write_corpus(tmp_path / "again", pairs=400, seed=5, valid=60, test=70)
    assert all(again[n].read_bytes() == paths[n].read_bytes() for n in names)


def test_docstring_example_is_a_generated_pair():
    lines = [line.strip() for line in synthetic.__doc__.splitlines()]
    src = next(line.removeprefix("source: ") for line in lines if line.startswith("source: "))
    tgt = next(line.removeprefix("target: ") for line in lines if line.startswith("target: "))
    assert (src, tgt) in generate_pairs(1000, seed=0)


def test_bad_side_is_rejected():
    with pytest.raises(ValueError, match="side"):
        vocabulary("en")


# The third language and the multilingual corpus.
THIRD_VOCAB = vocabulary("third")


def sentence(tree: dict, side: str) -> str:
    """The tree's sentence in one language, as text."""
    return synthetic.detokenize([w for w, _ in realize(tree, side)])


def test_source_and_target_unchanged_by_the_third_language():
    # Pinned before the third language existed: other tests, the demo and trained runs rely on these sentences.
    text = "\n".join(src + "\t" + tgt for src, tgt in generate_pairs(50, seed=3))
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "30ec093dd33ad4f2d96a54e72d79679df613eeb0a24f3f61a3377d2540a9aa4d"
    )


def test_third_language_is_deterministic_covered_and_its_own(trees):
    assert [realize(t, "third") for t in trees[:200]] == [realize(t, "third") for t in trees[:200]]
    used = {w for tree in trees for w, _ in realize(tree, "third")}
    assert used == set(THIRD_VOCAB)  # every word is in the vocabulary, and every entry is used
    # Nouns and verbs in two numbers, invariable adjectives, two articles, numerals, conjunctions, "that", ".".
    assert len(THIRD_VOCAB) == 2 * (len(NOUNS) + len(VERBS)) + len(ADJECTIVES) + 2 + 2 + 2 + 1 + 1
    assert all(w.isascii() and (w.isalpha() and w.islower() or w == ".") for w in THIRD_VOCAB)
    # No word but the period is shared with another language, so nothing can be copied across.
    assert set(THIRD_VOCAB) & (set(SRC_VOCAB) | set(TGT_VOCAB)) == {synthetic.PERIOD}


def test_third_language_is_never_longer_than_the_target(trees):
    # MAX_LEN holds by construction: sample_sentence checks only the source and target, so as not to change them.
    for tree in trees:
        third = realize(tree, "third")
        assert synthetic.MIN_LEN <= len(third) <= len(realize(tree, "tgt")) <= synthetic.MAX_LEN


def test_third_language_hand_checked_examples():
    np = {"noun": "king", "number": "pl", "det": "def", "adjs": ["old"]}
    obj = {"noun": "cat", "number": "sg", "det": "indef", "adjs": ["red", "big"]}
    tree = {"clauses": [{"subj": np, "verb": "see", "obj": obj}], "conj": None}
    assert sentence(tree, "src") == "li savi dunuri un piro kamur belur vidant."
    assert sentence(tree, "tgt") == "tha swil hulten grep ek blek grom krob."
    assert sentence(tree, "third") == "kikita yahotu nei heko miku mohu wena."  # see the-kings old cat big red
    girl = {"noun": "girl", "number": "sg", "det": "def", "adjs": []}
    birds = {"noun": "bird", "number": "pl", "det": "two", "adjs": []}
    fish = {"noun": "fish", "number": "pl", "det": "indef", "adjs": ["quick"]}
    said = {"subj": girl, "verb": "say", "that": {"subj": birds, "verb": "sing"}}
    tree = {"clauses": [said, {"subj": fish, "verb": "sleep"}], "conj": "but"}
    assert sentence(tree, "tgt") == "tha brin siget dat twa velmen zing bot nork gorpen slom."
    assert sentence(tree, "third") == "roka lani na ia huhuli wani yatiwi hena nenemo yapelu sepa."


def test_third_language_order_and_agreement(trees):
    for tree in trees:
        words = realize(tree, "third")
        position = {node: i for i, (_, node) in enumerate(words)}
        analysis = {node: THIRD_VOCAB[w] for w, node in words}
        for node, i in position.items():
            clause, _, part = node.rpartition(".")
            if part == "verb":
                # Verb first in its clause, the subject right after it (VSO), and a plural subject doubles it.
                assert i == min(j for n, j in position.items() if n.startswith(clause + "."))
                assert words[i + 1][1].startswith(clause + ".subj.")
                assert analysis[node][2] == analysis[clause + ".subj.noun"][2]
            elif part.startswith("adj"):
                assert i > position[clause + ".noun"]
                assert all(i < j for n, j in position.items() if n.startswith(clause + ".adj") and n < node)
            elif part == "det" and analysis[node][0] == "det":  # "the" follows its noun and agrees with it
                assert i == position[clause + ".noun"] + 1 and analysis[node][2] == analysis[clause + ".noun"][2]
            elif part == "det":  # a numeral precedes it
                assert i == position[clause + ".noun"] - 1


def test_third_language_aligns_to_the_source(trees):
    # Every third-language word expresses a tree node the source expresses too, with the same meaning.
    for tree in trees:
        src = {node: SRC_VOCAB[w] for w, node in realize(tree, "src")}
        for w, node in realize(tree, "third"):
            assert THIRD_VOCAB[w][:2] == src[node][:2], (w, node)


def test_every_language_says_one_tree_one_way(trees):
    # A sentence names its tree in every language, so each of the six directions is a function.
    for side in synthetic.SIDES:
        seen = {}
        for tree in trees:
            assert seen.setdefault(sentence(tree, side), tree) == tree, side


def test_docstring_example_third_line():
    lines = [line.strip() for line in synthetic.__doc__.splitlines()]
    src = next(line.removeprefix("source: ") for line in lines if line.startswith("source: "))
    third = next(line.removeprefix("third:").strip() for line in lines if line.startswith("third:"))
    rng = random.Random(0)
    tree = next(t for t in (sample_sentence(rng) for _ in range(1000)) if sentence(t, "src") == src)
    assert sentence(tree, "third") == third


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    out = tmp_path_factory.mktemp("multi")
    paths = write_multilingual_corpus(out, pairs_per_direction=100, seed=5, valid=30, test=40)
    return out, paths, {name: path.read_text(encoding="utf-8").splitlines() for name, path in paths.items()}


def test_multilingual_corpus_files(multilingual):
    out, paths, lines = multilingual
    directions = [(s, t) for s in LANGUAGES for t in LANGUAGES if s != t]
    assert len(directions) == 6 and synthetic.LANGUAGES == {"xa": "src", "xb": "tgt", "xc": "third"}
    names = [
        f"{split}.{s}-{t}.{code}" for split in ("train", "valid", "test") for s, t in directions for code in (s, t)
    ]
    assert sorted(paths) == sorted(names) and all(paths[n] == out / n for n in names)
    for name in names:
        assert len(lines[name]) == {"train": 100, "valid": 30, "test": 40}[name.split(".")[0]]
    # Every line pair is one tree in two languages, the first trees of the seed's stream.
    rng = random.Random(5)
    first = [sample_sentence(rng) for _ in range(1500)]
    for name in names[::2]:
        split, direction, _ = name.split(".")
        s, t = direction.split("-")
        real = {(sentence(tree, LANGUAGES[s]), sentence(tree, LANGUAGES[t])) for tree in first}
        assert set(zip(lines[f"{split}.{direction}.{s}"], lines[f"{split}.{direction}.{t}"], strict=True)) <= real
    # Each direction's train file says different things: trees are dealt to the directions in turn.
    xb, xc = set(lines["train.xa-xb.xa"]), set(lines["train.xa-xc.xa"])
    assert len(xb & xc) < 0.1 * len(xb)  # only a few short sentences come up twice


def test_multilingual_held_out_is_shared_and_never_trained(multilingual, tmp_path):
    _, paths, lines = multilingual
    for split in ("valid", "test"):
        for code in LANGUAGES:
            # A language's held-out lines are the same whichever direction it is in (the same trees, in order).
            files = [lines[n] for n in lines if n.startswith(split + ".") and n.endswith("." + code)]
            assert len(files) == 4 and all(f == files[0] for f in files)
    held_out = {line for name, text in lines.items() if not name.startswith("train.") for line in text}
    trained = {line for name, text in lines.items() if name.startswith("train.") for line in text}
    assert len(held_out) == 3 * (30 + 40) and not held_out & trained
    # The held-out trees are write_corpus's for the same seed, and the whole corpus is deterministic.
    toy = write_corpus(tmp_path / "toy", pairs=10, seed=5, valid=30, test=40)
    assert toy["valid.src"].read_text() == paths["valid.xa-xb.xa"].read_text()
    assert toy["test.tgt"].read_text() == paths["test.xa-xb.xb"].read_text()
    again = write_multilingual_corpus(tmp_path / "again", pairs_per_direction=100, seed=5, valid=30, test=40)
    assert all(again[n].read_bytes() == paths[n].read_bytes() for n in paths)
    bigger = write_multilingual_corpus(tmp_path / "bigger", pairs_per_direction=150, seed=5, valid=30, test=40)
    assert all(bigger[n].read_text().splitlines()[:100] == lines[n] for n in paths if n.startswith("train."))


def test_multilingual_directions(tmp_path):
    paths = write_multilingual_corpus(tmp_path, 20, valid=5, test=5, directions=[("xb", "xc"), ("xc", "xa")])
    assert sorted(paths) == sorted(
        f"{split}.{d}.{code}"
        for split in ("train", "valid", "test")
        for d in ("xb-xc", "xc-xa")
        for code in d.split("-")
    )
    for bad in ([("xa", "xa")], [("xa", "en")], [("xa", "xb"), ("xa", "xb")], [("xa", "xb", "xc")]):
        with pytest.raises(ValueError, match="direction"):
            write_multilingual_corpus(tmp_path, 20, valid=5, test=5, directions=bad)
