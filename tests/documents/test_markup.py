"""Inline markup through translation: the words are the plain sentence's, the tags stay balanced, nested and placed."""

import html
import random
import re

import numpy as np
import pytest
from conftest import best_seconds

from nanomt.decoding.alignment import cross_attention
from nanomt.documents import markup
from nanomt.documents.markup import Alignment, Tag, Text

# A source vocabulary and its word-by-word "translation"; the fake translator permutes the words.
LEX = {
    "der": "the",
    "Hund": "dog",
    "läuft": "runs",
    "schnell": "fast",
    "über": "across",
    "die": "that",
    "Straße": "street",
    "und": "and",
    "bellt": "barks",
    "laut": "loudly",
    "heute": "today",
    "im": "in",
    "Park": "park",
    "Käse": "cheese",
    "&": "&",
    "<": "<",
    ".": ".",
    ",": ",",
}
SOURCE_WORDS = [w for w in LEX if w not in (".", ",")]
TOKEN = re.compile(r"\w+|[^\w\s]")  # the fake translator's own word splitting


def identity(n):
    return list(range(n))


def reverse(n):
    return list(range(n - 1, -1, -1))


def shuffled(n):
    order = list(range(n))
    random.Random(n).shuffle(order)
    return order


def pairs_swapped(n):
    return [i ^ 1 if (i ^ 1) < n else i for i in range(n)]


def pieces_of(words, subwords):
    """SentencePiece-like pieces of words (▁ starts a word; punctuation sticks to the word before), and their word."""
    pieces, owner = [], []
    for k, w in enumerate(words):
        chunks = [w[i : i + 2] for i in range(0, len(w), 2)] if subwords else [w]
        for j, c in enumerate(chunks):
            pieces.append(("▁" if j == 0 and not re.fullmatch(r"[^\w\s]", w) else "") + c)
            owner.append(k)
    return pieces, owner


def joined(words):
    """Words as text, punctuation written against the word before it."""
    return "".join(("" if re.fullmatch(r"[.,]", w) or not i else " ") + w for i, w in enumerate(words))


class Fake:
    """Word-by-word translation with a known permutation, and the attention matrix built from that permutation."""

    def __init__(self, permute, subwords=False, sink=0.0):
        self.permute, self.subwords, self.sink, self.seen = permute, subwords, sink, []

    def __call__(self, sentences):
        self.seen += sentences
        return [self.one(s) for s in sentences]

    def one(self, sentence):
        src = TOKEN.findall(sentence)
        order = self.permute(len(src))
        tgt = [LEX.get(src[j], src[j]) for j in order]
        src_pieces, src_owner = pieces_of(src, self.subwords)
        tgt_pieces, tgt_owner = pieces_of(tgt, self.subwords)
        weights = np.zeros((len(tgt_pieces) + 1, len(src_pieces) + 1))
        for p, t in enumerate(tgt_owner):
            cols = [q for q, s in enumerate(src_owner) if s == order[t]]
            weights[p, cols] = (1 - self.sink) / len(cols)
        weights[:, -1] += self.sink  # attention that sinks into </s>, as trained models' does
        weights[-1, -1] = 1
        translation = joined(tgt) if self.subwords else " ".join(tgt)
        return Alignment(translation, (*src_pieces, "</s>"), (*tgt_pieces, "</s>"), weights)


def table(words, align):
    """A translator that returns `words` with a hand-made alignment: target word t <- source word align[t]."""

    def run(sentences):
        out = []
        for s in sentences:
            src = s.split()
            weights = np.zeros((len(words) + 1, len(src) + 1))
            for t, a in enumerate(align):
                if a is not None:
                    weights[t, a] = 1
            weights[-1, -1] = 1
            pieces = (tuple("▁" + w for w in src) + ("</s>",), tuple("▁" + w for w in words) + ("</s>",))
            out.append(Alignment(" ".join(words), *pieces, weights))
        return out

    return run


# Generated tagged sentences: a tree of words, elements and voids, written in canonical form (single spaces, tags
# hugging their words), with a unique data-k on every element and void so that each can be followed.
NAMES = ["b", "i", "a", "span", "em", "strong", "sub"]
ATTRS = ['href="/x?a=1&amp;b=2"', 'title="&quot;quoted&quot; &lt;here&gt;"', 'class="c1 c2"', "lang=de"]
VOIDS = [
    '<img data-k="{k}" src="p.png" alt="a &amp; b">',
    "<!-- note {k} -->",
    '<code data-k="{k}">x &lt; y <b>z</b></code>',
    '<span data-k="{k}" translate="no">Kein Text</span>',
    '<script data-k="{k}">if (a < b && c) {{ x = "</p>"; }}</script>',
    '<style data-k="{k}">p > b {{ color: red }}</style>',
    '<kbd data-k="{k}">Ctrl</kbd>',
    '<b data-k="{k}" class="notranslate">Name</b>',
]


class Gen:
    """Random trees of words, elements (some empty) and voids."""

    def __init__(self, seed, voids=True, empty=True):
        self.rng, self.k, self.voids, self.empty = random.Random(seed), 0, voids, empty

    def key(self):
        self.k += 1
        return self.k

    def children(self, depth):
        out = []
        for _ in range(self.rng.randint(1 if depth else 2, 4)):
            roll = self.rng.random()
            if roll < 0.25 and depth < 4:
                attrs = " ".join(self.rng.sample(ATTRS, self.rng.randint(0, 2)))
                name = self.rng.choice(NAMES)
                kids = [] if self.empty and self.rng.random() < 0.1 else self.children(depth + 1)
                out.append(("el", name, f'<{name} data-k="{self.key()}"' + (f" {attrs}" if attrs else "") + ">", kids))
            elif roll < 0.35 and self.voids:
                out.append(("void", self.rng.choice(VOIDS).format(k=self.key())))
            else:
                out.append(("w", self.rng.choice(SOURCE_WORDS)))
        return out

    def voids_between_words(self, children):
        """Voids added between two sibling words only (never at an edge, never two in one gap)."""
        out = []
        for child in children:
            if child[0] == "el":
                child = (*child[:3], self.voids_between_words(child[3]))
            if out and child[0] == "w" and out[-1][0] == "w" and self.rng.random() < 0.4:
                out.append(("void", self.rng.choice(VOIDS).format(k=self.key())))
            out.append(child)
        return out


def render(children, word=lambda w: html.escape(w, quote=False), mirror=False):
    """Canonical HTML of a tree; `mirror` reverses every list of children (a fully reversed translation)."""
    parts = []
    for child in reversed(children) if mirror else children:
        if child[0] == "w":
            parts.append(word(child[1]))
        elif child[0] == "void":
            parts.append(child[1])
        else:
            parts.append(child[2] + render(child[3], word, mirror) + f"</{child[1]}>")
    return " ".join(parts)


def words_of(children):
    return [w for c in children for w in ([c[1]] if c[0] == "w" else words_of(c[3]) if c[0] == "el" else [])]


def voids_of(children):
    return [v for c in children for v in ([c[1]] if c[0] == "void" else voids_of(c[3]) if c[0] == "el" else [])]


def cases(n=150, voids=True):
    out = []
    for seed in range(n):
        tree = Gen(seed, voids).children(0)
        if words_of(tree):
            out.append(tree)
    return out


def structure(doc, voids):
    """The tag sequence of doc (each void one token) and each element's and void's parent; asserts balance."""
    for i, v in enumerate(voids):
        assert doc.count(v) == 1, f"void {v!r} is not in the output exactly once:\n{doc}"
        doc = doc.replace(v, f"<void data-k=v{i}>")
    sequence, parents, stack = [], {}, [None]
    for m in re.finditer(r"<(/?)([a-z]+)(?:[^>]*?data-k=\"?(v?\d+))?[^>]*>", doc):
        close, name, key = m.groups()
        sequence.append(m.group())
        if close:
            assert stack[-1] is not None and stack[-1][0] == name, f"unbalanced at {m.group()!r}:\n{doc}"
            stack.pop()
            continue
        parents[key] = stack[-1][1] if stack[-1] else None
        if name not in ("void", "img"):
            stack.append((name, key))
    assert stack == [None], f"unclosed {stack[1:]}:\n{doc}"
    return sequence, parents


def visible(doc, voids):
    """The text a reader sees outside the voids, whitespace collapsed."""
    for v in voids:
        doc = doc.replace(v, " ")
    return " ".join(html.unescape(re.sub(r"<[^>]*>", " ", doc)).split())


PERMUTATIONS = [identity, reverse, shuffled, pairs_swapped]


@pytest.mark.parametrize("permute", PERMUTATIONS)
@pytest.mark.parametrize("subwords", [False, True])
def test_tagged_sentence_translates_to_the_plain_sentences_words(permute, subwords):
    for tree in cases():
        doc, plain = f"<p>{render(tree)}</p>", " ".join(words_of(tree))
        fake = Fake(permute, subwords, sink=0.3)
        out = markup.translate_html([doc], fake)[0]
        assert fake.seen == [plain], "the model must read the whole sentence, tags taken out"
        expected = Fake(permute, subwords).one(plain).translation
        assert visible(out, voids_of(tree)) == " ".join(expected.split()), doc


@pytest.mark.parametrize("permute", PERMUTATIONS)
def test_tags_stay_balanced_nested_and_in_document_order(permute):
    for tree in cases():
        doc = f"<p>{render(tree)}</p>"
        out = markup.translate_html([doc], Fake(permute, subwords=True, sink=0.3))[0]
        voids = voids_of(tree)
        source_sequence, source_parents = structure(doc, voids)
        sequence, parents = structure(out, voids)
        assert parents == source_parents, f"{doc}\n{out}"  # every element and void once, inside the same parent
        assert sorted(sequence) == sorted(source_sequence)  # attributes byte-identical
        if permute is identity:  # word for word, in order: the canonical document with its words translated
            assert sequence == source_sequence
            assert out == f"<p>{render(tree, word=lambda w: html.escape(LEX[w], quote=False))}</p>"


def test_reversed_translation_mirrors_the_tags():
    """Reversing the words reverses every element's children: the reference is the generated tree, mirrored."""
    # Voids go between the translations of their neighbours; at an edge or two in one gap they keep to the edge and
    # to their order, so the mirror is the reference for voids between two words.
    for seed in range(150):
        gen = Gen(seed, voids=False, empty=False)
        tree = gen.voids_between_words(gen.children(0))
        out = markup.translate_html([render(tree)], Fake(reverse, subwords=True, sink=0.3))[0]
        expected = render(tree, word=lambda w: html.escape(LEX[w], quote=False), mirror=True)
        assert re.findall(r"<[^>]+>|[^<\s]+", out) == re.findall(r"<[^>]+>|[^<\s]+", expected), render(tree)


# The placement rule on hand-made alignment tables: source "A <b>B C</b> D", target words and their source word.
@pytest.mark.parametrize(
    "words, align, expected",
    [
        ("a b c d", [0, 1, 2, 3], "a <b>b c</b> d"),  # one to one, in order
        ("a b d", [0, 1, 3], "a <b>b</b> d"),  # a dropped word
        ("a b1 b2 c d", [0, 1, 1, 2, 3], "a <b>b1 b2 c</b> d"),  # one source word, two target words
        ("a b x c d", [0, 1, None, 2, 3], "a <b>b x c</b> d"),  # an unaligned word between the element's words
        ("a x b c d", [0, None, 1, 2, 3], "a x <b>b c</b> d"),  # an unaligned word at its edge stays outside
        ("d a b c", [3, 0, 1, 2], "d a <b>b c</b>"),  # the element moves with its words
        ("c b a d", [2, 1, 0, 3], "<b>c b</b> a d"),
        ("a c d b c2", [0, 2, 3, 1, 2], "a c d <b>b c2</b>"),  # torn apart: the span that agrees with most words
        ("a c d b", [0, 2, 3, 1], "a <b>c</b> d b"),  # of equal spans, the earliest
        ("a d", [0, 3], "a<b></b> d"),  # all its words dropped: an empty element where they were
        ("a b c a2 d", [0, 1, 2, 0, 3], "a <b>b c</b> a2 d"),
    ],
)
def test_placement_rule(words, align, expected):
    out = markup.translate_html(["<p>A <b>B C</b> D</p>"], table(words.split(), align))[0]
    assert out == f"<p>{expected}</p>"


@pytest.mark.parametrize(
    "source, words, align, expected",
    [
        ("A <img> B", "b a", [1, 0], "b <img> a"),  # a void between the translations of its neighbours
        ("A <img> B C", "a c b", [0, 2, 1], "a c <img> b"),  # before its right neighbour's translation
        ("<img> A B", "b a", [1, 0], "<img> b a"),  # at a sentence's start it stays there
        ("<b>A</b> and <i>C</i>", "c and a", [2, 1, 0], "<i>c</i> and <b>a</b>"),  # siblings swap
        ("<a>A <b>B</b></a> C", "c b a", [2, 1, 0], "c <a><b>b</b> a</a>"),  # nesting kept
        ("<a>A <b>B</b></a> C", "b c a", [1, 2, 0], "<a><b>b</b></a> c a"),  # a child never leaves its parent
        ("A <b>B</b> C", "a c", [0, 2], "a<b></b> c"),
    ],
)
def test_placement_of_voids_and_nested_elements(source, words, align, expected):
    assert markup.translate_html([source], table(words.split(), align))[0] == expected


def test_a_word_takes_the_alignment_of_its_pieces_by_their_share():
    """Subword pieces pointing different ways: the word goes where most of its characters' attention goes."""
    src = ("▁A", "▁B", "▁C", "</s>")

    def run(weights):
        tgt = ("▁Stra", "ße", "▁x", "</s>")  # "Stra" is 4 of the word's 6 characters
        return lambda s: [Alignment("Straße x", src, tgt, np.array(weights, dtype=float))]

    into_b = [[0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]]
    assert markup.translate_html(["A <b>B</b> C"], run(into_b))[0] == "<b>Straße</b> x"
    out_of_b = [[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]
    assert markup.translate_html(["A <b>B</b> C"], run(out_of_b))[0] == "Straße<b></b> x"


def test_align_words_maps_pieces_onto_words():
    """Pieces that glue punctuation, split words, or stand for an unknown character, against a hand-made table."""
    source = "Der Hund, der ☃ bellt."
    src_words = [m.span() for m in markup.WORD.finditer(source)]  # Der Hund , der ☃ bellt .
    src = ("▁Der", "▁Hu", "nd", ",", "▁der", "▁", "<unk>", "▁bel", "lt", ".", "</s>")
    tgt = ("▁The", "▁dog", ",", "▁that", "▁?", "▁bar", "ks", ".", "</s>")
    points = [0, 1, 3, 4, 6, 8, 7, 9, 10]  # target piece -> source piece
    weights = np.full((len(tgt), len(src)), 0.01)
    weights[:, -1] = 0.5  # the sink on </s> never decides
    weights[np.arange(len(tgt)), points] = 1.0
    spans, align = markup.align_words(source, src_words, Alignment("The dog, that ? barks.", src, tgt, weights))
    assert ["The dog, that ? barks."[a:b] for a, b in spans] == ["The", "dog", ",", "that", "?", "barks", "."]
    assert align == [0, 1, 2, 3, 4, 5, 6]


def test_align_words_without_weights_goes_by_position():
    spans, align = markup.align_words("a b c", [(0, 1), (2, 3), (4, 5)], Alignment("w x"))
    assert align == [0, 2]  # the source word under each target word's middle


def test_balance_pairs_by_name_and_keeps_strays_as_voids():
    b, i, b_end, i_end, u_end = (
        Tag("open", "<b>", "b"),
        Tag("open", "<i>", "i"),
        Tag("close", "</b>", "b"),
        Tag("close", "</i>", "i"),
        Tag("close", "</u>", "u"),
    )
    out = markup.balance([b, Text("x"), i, Text("y"), b_end, i_end, u_end])
    assert [(t.kind, t.raw) if isinstance(t, Tag) else t.text for t in out] == [
        ("open", "<b>"),
        "x",
        ("void", "<i>"),  # opened inside <b> and not closed there
        "y",
        ("close", "</b>"),
        ("void", "</i>"),
        ("void", "</u>"),
    ]


def test_block_tags_split_sentences_and_the_splitter_splits_within_a_block():
    fake = Fake(identity)
    doc = "<h1>der Hund</h1><p>der Hund läuft. die <b>Straße. und</b> der Park.</p><ul><li>heute</li></ul>x<br>y"
    out = markup.translate_html([doc], fake, lambda text: re.split(r"(?<=\.) ", text))[0]
    assert fake.seen == ["der Hund", "der Hund läuft.", "die Straße.", "und der Park.", "heute", "x", "y"]
    # One element over two sentences keeps one pair of tags around both translations.
    assert out == (
        "<h1>the dog</h1><p>the dog runs . that <b>street . and</b> the park .</p><ul><li>today</li></ul>x<br>y"
    )


def test_code_scripts_comments_and_untranslated_spans_pass_through_untouched():
    keep = [
        "<pre>Der <b>Hund</b>\n  läuft</pre>",
        "<code>der &amp; Hund</code>",
        "<script>var s = '<b>Der Hund</b>';</script>",
        "<style>b::after { content: 'Hund' }</style>",
        "<!-- der Hund -->",
        '<span translate="no">der Hund</span>',
        '<div translate="NO"><p>der Hund</p></div>',
        '<em class="x notranslate">der Hund</em>',
        "<textarea>der Hund</textarea>",
    ]
    doc = "<p>Der Hund " + " läuft ".join(keep) + " bellt.</p>"
    out = markup.translate_html([doc], markup.plain(lambda xs: [x.upper() for x in xs]))[0]
    for piece in keep:
        assert piece in out
    assert "DER HUND" in out and "BELLT" in out


def test_entities_and_attributes_survive():
    link = '<a href="/x?a=1&amp;b=2" data-x=\'"\'>'
    doc = f'<p title="a &amp; b">K&auml;se &amp; Wurst &lt;3 &nbsp;{link}der Hund</a></p>'
    out = markup.translate_html([doc], markup.plain(lambda xs: [x.upper() for x in xs]))[0]
    assert out == f'<p title="a &amp; b">KÄSE &amp; WURST &lt;3 &nbsp;{link}DER HUND</a></p>'


def test_identity_round_trip_keeps_the_document():
    doc = (
        "<!DOCTYPE html>\n<html>\n<head>\n  <title>Der Hund</title>\n  <meta charset=utf-8>\n</head>\n<body>\n"
        '  <p class="lead">\n    Der <b>große</b> Hund läuft <a href="/park">im Park</a>.\n  </p>\n'
        "  <ul>\n    <li><img src=dog.png alt=dog> Der Hund</li>\n    <li>2024</li>\n  </ul>\n</body>\n</html>\n"
    )
    assert markup.translate_html([doc], markup.plain(list))[0] == doc


def test_text_without_letters_is_not_translated():
    seen = []
    out = markup.translate_html(["<p>2024</p><p> — </p><p>§ 3</p>"], markup.plain(lambda xs: seen.extend(xs) or xs))
    assert out == ["<p>2024</p><p> — </p><p>§ 3</p>"] and seen == []


MALFORMED = [
    "<b>",
    "</b>",
    "<i>",
    "</i>",
    "<p>",
    "</p>",
    "<a href='x>",
    '<a href="unclosed',
    "<",
    ">",
    "&",
    "&bogus;",
    "&amp",
    "&#xZZ;",
    "<![x[",
    "<![CDATA[x]]>",
    "<!",
    "<?pi?>",
    "<!-- open",
    "-->",
    "<br/>",
    "<img",
    "<code>",
    "</code>",
    "<script>",
    "<div translate=no>",
    "<b/>",
    "<span class=notranslate>",
    "\n",
    " ",
    "<<b>>",
    "<!DOCTYPE",
    "</ b>",
    "<b =x>",
]


def test_malformed_html_is_translated_as_well_as_it_can_be_and_never_raises():
    rng = random.Random(0)
    for _ in range(400):
        pieces = [rng.choice(MALFORMED + SOURCE_WORDS + ["Hund.", "der"]) for _ in range(rng.randint(1, 14))]
        doc = "".join(p if rng.random() < 0.5 else p + " " for p in pieces)
        out = markup.translate_html([doc], markup.plain(list))[0]
        # Nothing is lost: the characters a reader sees (entities resolved, whitespace aside) are all there.
        assert sorted("".join(html.unescape(out).split())) == sorted("".join(html.unescape(doc).split())), doc
        markup.translate_html([doc], Fake(shuffled, subwords=True))


# Markup that nothing after it closes, repeated to the end: the standard parser's close() searched for its end again
# from each one. "ľ" (U+013E) has the low byte of ">": str.find cannot skip ahead with memchr, so the declaration's
# quadratic time shows at a test's size.
@pytest.mark.serial  # a ratio of two timings: alone, not beside another worker's test
@pytest.mark.parametrize(
    "unclosed, n", [("<!--", 10000), ("<!-- x >", 10000), ("<?", 40000), ("<!ľ", 20000), ("</a", 40000), ("<a b", 4000)]
)
def test_unclosed_markup_parses_in_linear_time_and_is_kept_as_it_is(unclosed, n):
    small, large = ("<p>der Hund " + unclosed * (k // len(unclosed)) for k in (n, 8 * n))
    assert best_seconds(markup.html_parts, large) < 3 * 8 * best_seconds(markup.html_parts, small)  # not 64x
    out = markup.translate_html([small], markup.plain(lambda xs: [x.upper() for x in xs]))[0]
    assert out == "<p>DER HUND " + small.removeprefix("<p>der Hund ")


def test_deep_nesting_and_long_paragraphs_do_not_break_the_placement():
    deep = "<p>" + "<b>" * 1000 + "der Hund" + "</b>" * 1000 + "</p>"
    out = markup.translate_html([deep], Fake(reverse))[0]
    assert out.count("<b>") == 1000 and out.count("</b>") == 1000 and "dog the" in out
    many = "<p>" + " ".join(f"<i>{w}</i> und" for w in SOURCE_WORDS * 20) + "</p>"
    out = markup.translate_html([many], Fake(shuffled))[0]
    structure(out, [])


def test_alignment_and_translate_results_are_validated():
    with pytest.raises(ValueError, match="do not match"):
        Alignment("x", ("▁a",), ("▁x", "</s>"), np.ones((1, 1)))
    with pytest.raises(ValueError, match="2 sentences"):
        markup.translate_segments([[Text("a. b.")]], lambda xs: [], lambda t: ["a.", "b."])


def test_cross_attention_averages_the_heads_of_the_penultimate_layer():
    layers = [np.full((2, 3, 4), 9.0), np.stack([np.eye(3, 4), np.zeros((3, 4))]), np.full((2, 3, 4), 7.0)]
    assert np.array_equal(cross_attention(layers), np.eye(3, 4) / 2)
    assert np.array_equal(cross_attention(layers[:1]), np.full((3, 4), 9.0))


def test_a_translators_attention_makes_an_alignment_markup_can_use(toy_corpus, tmp_path, one_thread):
    """The wiring: Translator.attention's pieces and cross-attention (a random model) make a valid Alignment, and a
    tagged paragraph comes back with the words the translator gives the plain sentences."""
    from conftest import random_transformer

    from nanomt.core.config import Config, DataConfig, DecodeConfig
    from nanomt.core.tokenizer import train_tokenizer
    from nanomt.decoding.translate import Translator

    lines = {n: toy_corpus[n].read_text(encoding="utf-8").splitlines() for n in ("train.src", "train.tgt")}
    data = DataConfig(vocab_size=120, shared_vocab=False)
    tokenizer = train_tokenizer(lines["train.src"], lines["train.tgt"], tmp_path, data)
    model = random_transformer(0, 120, layers=2)
    translator = Translator(model, tokenizer, Config(model=model.cfg, data=data, decode=DecodeConfig(beam_size=1)))

    def aligned(sentences):
        out = []
        for s in sentences:
            a = translator.attention(s)
            weights = cross_attention(a.cross)
            out.append(Alignment(a.translation, tuple(a.src_tokens), tuple(a.tgt_tokens), weights))
        return out

    tagged = "<p>la <b>fesa</b> dormat.</p><p>una <i>zira</i> un <a href=x>musko serur</a> lemat.</p>"
    out = markup.translate_html([tagged], aligned)[0]
    expected = translator.translate(["la fesa dormat.", "una zira un musko serur lemat."], beam_size=1)
    assert all(len(e.split()) > 1 for e in expected), expected
    paragraphs = re.findall(r"<p>(.*?)</p>", out)
    assert [visible(p, []) for p in paragraphs] == [" ".join(e.split()) for e in expected]
    structure(out, [])
