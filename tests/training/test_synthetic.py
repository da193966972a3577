"""The built-in toy language pair: determinism, corpus files, and a grammar that is what it claims."""

import random
from collections import defaultdict

import pytest

from nanomt.training import synthetic
from nanomt.training.synthetic import (
    ADJECTIVES,
    NOUNS,
    VERBS,
    generate_aligned,
    generate_pairs,
    realize,
    sample_sentence,
    vocabulary,
    write_corpus,
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
