"""Inline markup through translation: a sentence is translated whole and its tags go back around the aligned words."""

# The method is Bergamot's (browsermt/bergamot-translator PR#253, PR#312): tags are taken out, the plain sentence is
# translated, and each element is put back around the target words whose attention points into the source words it
# enclosed. Here an element is placed once (never duplicated), inside its parent, over the contiguous span of target
# words that agrees best with the alignment; voids (images, inline code, comments, stray tags) go to the gap between
# the translations of the source words they stood between.

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser

import numpy as np

from nanomt.decoding.alignment import Alignment
from nanomt.decoding.pieces import SPECIAL_PIECES

# The words tags may go between: a run of letters and digits, one CJK character (those scripts use no spaces) or one
# other visible character. Python's \s counts a no-break space as whitespace, so it joins no word.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
WORD = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+|[^\w\s]")
SPACE_CHARS = " \t\n\r\f"  # HTML's whitespace: a no-break space is text, not a separator
SPACE_OR_NOT = re.compile(r"[ \t\n\r\f]+|[^ \t\n\r\f]+")
LETTER = re.compile(r"[^\W\d_]")  # a text with no letter (numbers, punctuation) is kept as it is
MAX_DEPTH = 64  # elements nested deeper than this are kept as voids (the placement recurses once per level)
MAX_CELLS = 4_000_000  # words x states of one placement table; a larger one is placed greedily


@dataclass(frozen=True)
class Text:
    """Text between tags, as the reader sees it (entities resolved)."""

    text: str


@dataclass(frozen=True, eq=False)
class Tag:
    """Markup at one place in a text: an element's opening or closing tag, or a void kept whole where it stood."""

    kind: str  # "open", "close" or "void"
    raw: object  # what the output writes for it: the tag's text in HTML and Markdown, an XML element in Word
    name: str = ""  # a close pairs with the nearest open of its name
    space: bool = False  # a void that separates words as whitespace does (a line break kept as it was)

    def __post_init__(self):
        if self.kind not in ("open", "close", "void"):
            raise ValueError(f"a tag is 'open', 'close' or 'void', not {self.kind!r}")


Item = Text | Tag


# Source sentences -> their translations with alignments, in order; and text -> its sentences, in order.
Translate = Callable[[list[str]], list[Alignment]]
Split = Callable[[str], list[str]]


def plain(translate: Callable[[list[str]], list[str]]) -> Translate:
    """A translate function without alignments (its words are then aligned in order, by position)."""
    return lambda sentences: [Alignment(t) for t in translate(sentences)]


def balance(items: list[Item]) -> list[Item]:
    """Pairs each close with the nearest open of its name; unpaired or crossing tags, and deep ones, become voids."""
    out, stack = list(items), []
    for i, item in enumerate(out):
        if not isinstance(item, Tag) or item.kind == "void":
            continue
        if item.kind == "open":
            if len(stack) < MAX_DEPTH:
                stack.append(i)
            else:
                out[i] = _void(item)
            continue
        j = next((k for k in range(len(stack) - 1, -1, -1) if out[stack[k]].name == item.name), None)
        if j is None:
            out[i] = _void(item)
            continue
        for k in stack[j + 1 :]:  # opened inside and never closed there: kept where they stood
            out[k] = _void(out[k])
        del stack[j:]
    for k in stack:
        out[k] = _void(out[k])
    return out


def _void(tag: Tag) -> Tag:
    return Tag("void", tag.raw, tag.name)


@dataclass(eq=False)
class _Node:
    """The root, an element or a void, over source words [lo, hi); a void or an empty element has lo == hi."""

    open: Tag | None = None
    close: Tag | None = None
    lo: int = 0
    hi: int = 0
    children: list[_Node] = field(default_factory=list)
    before: str = ""  # the source's whitespace around a void or an empty element, written back with it
    after: str = ""


@dataclass
class _Source:
    """One segment's plain text (whitespace collapsed), its words, its element tree and its sentences."""

    text: str
    words: list[tuple[int, int]]
    root: _Node
    lead: str
    trail: str
    sentences: list[tuple[int, int]]  # char spans of text
    sentence_words: list[tuple[int, int]]  # word ranges of each sentence


def _pieces(items: list[Item]) -> list[tuple[str, object]]:
    """The items as ("ws", raw) / ("text", chars) / ("tag", Tag) entries; adjacent texts joined first."""
    seq, buf = [], []
    for item in [*items, None]:
        if isinstance(item, Text):
            buf.append(item.text)
            continue
        for m in SPACE_OR_NOT.finditer("".join(buf)):
            seq.append(("ws" if m.group()[0] in SPACE_CHARS else "text", m.group()))
        buf = []
        if item is not None:
            seq.append(("tag", item))
    return seq


def _source(items: list[Item], split: Split | None) -> _Source:
    """The plain text the model reads, its words, and the tree of elements over them."""
    seq = _pieces(balance(items))
    solid = [i for i, (kind, _) in enumerate(seq) if kind != "ws"]
    first, last = (solid[0], solid[-1]) if solid else (len(seq), -1)
    text, pending, flow = "", False, []  # flow: (kind, value, offset in text) of each entry in order
    for kind, value in seq[first : last + 1]:
        if kind == "ws" or (kind == "tag" and value.kind == "void" and value.space):
            pending = True
        if kind == "text":
            text += (" " if pending and text else "") + value
            pending = False
        flow.append((kind, value, len(text)))
    words = _words(text, sorted({o for kind, _, o in flow if kind == "tag"}))
    lead = "".join(v for _, v in seq[:first])
    trail = "".join(v for _, v in seq[last + 1 :])
    spans, ranges = _sentences(text, words, split)
    return _Source(text, words, _tree(flow, words), lead, trail, spans, ranges)


def _tree(flow: list[tuple], words: list[tuple[int, int]]) -> _Node:
    """The elements over the words; a void (or empty element) keeps the whitespace around it, each space once."""
    # Whitespace goes to the void on its left, else to the one on its right (an open tag passes that claim on).
    starts = [a for a, _ in words]
    root = _Node(lo=0, hi=len(words))
    stack, spare, owner = [root], "", None
    for kind, value, offset in flow:
        if kind == "text":
            spare, owner = "", None
        elif kind == "ws" and owner is not None:
            owner.after += value
        elif kind == "ws":
            spare += value
        elif value.kind == "open":
            stack.append(_Node(value, lo=bisect_left(starts, offset), before=spare))
            stack[-2].children.append(stack[-1])
            spare = ""
        elif value.kind == "close":
            node = stack.pop()
            node.close, node.hi = value, bisect_left(starts, offset)
            if node.lo < node.hi:  # whitespace after it is outside it: no void inside may claim it
                node.before, owner = "", None
            else:
                spare, owner = "", node
        else:
            gap = bisect_left(starts, offset)
            stack[-1].children.append(_Node(value, lo=gap, hi=gap, before=spare))
            spare, owner = "", stack[-1].children[-1]
    return root


def _words(text: str, cuts: list[int]) -> list[tuple[int, int]]:
    """The words of text, cut where a tag stood inside one."""
    words = []
    for m in WORD.finditer(text):
        a, b = m.span()
        points = [a, *(c for c in cuts[bisect_right(cuts, a) : bisect_left(cuts, b)]), b]
        words += zip(points, points[1:])
    return words


def _sentences(text: str, words: list[tuple[int, int]], split: Split | None):
    """Char spans of the sentences split finds in text, and the words of each; one sentence where it finds none."""
    whole = ([(0, len(text))], [(0, len(words))])
    if split is None:
        return whole
    spans, at = [], 0
    for sentence in map(str.strip, split(text)):
        i = text.find(sentence, at)
        if i < 0:  # a splitter that rewrites its input: the text is translated as one sentence
            return whole
        if sentence:
            spans.append((i, i + len(sentence)))
            at = i + len(sentence)
    starts = [a for a, _ in words]
    ranges = [(bisect_left(starts, a), bisect_left(starts, b)) for a, b in spans]
    if not spans or sum(hi - lo for lo, hi in ranges) != len(words):  # some word in no sentence
        return whole
    return spans, ranges


def _piece_sizes(pieces: tuple[str, ...]) -> np.ndarray:
    """The visible characters each piece stands for."""
    visible = ["".join(p.replace("▁", " ").split()) for p in pieces]
    sizes = [0 if p in SPECIAL_PIECES else 1 if p == "<unk>" else len(v) for p, v in zip(pieces, visible)]
    return np.array(sizes, dtype=np.float64)


def _overlap(pieces: tuple[str, ...], text: str, words: list[tuple[int, int]]) -> np.ndarray:
    """(P, W): how many visible characters piece p shares with word w, the pieces stretched over the text's."""
    visible = np.concatenate([[0], np.cumsum([not c.isspace() for c in text])])
    w0, w1 = visible[[a for a, _ in words]], visible[[b for _, b in words]]
    sizes = _piece_sizes(pieces)
    # Normalization (NFKC, unknown pieces) may change the count: positions are scaled to the text's.
    scale = visible[-1] / sizes.sum() if sizes.sum() else 0.0
    p1 = np.cumsum(sizes) * scale
    p0 = p1 - sizes * scale
    return np.clip(np.minimum(p1[:, None], w1[None]) - np.maximum(p0[:, None], w0[None]), 0, None)


Spans = list[tuple[int, int]]


def align_words(source: str, src_words: Spans, al: Alignment) -> tuple[Spans, list[int | None]]:
    """The translation's words (char spans) and, for each, the index of the source word it aligns with, or None."""
    tgt_words = [m.span() for m in WORD.finditer(al.translation)]
    n, m = len(tgt_words), len(src_words)
    if not n or not m:
        return tgt_words, [None] * n
    if al.weights is None:
        return tgt_words, [min(m - 1, (2 * t + 1) * m // (2 * n)) for t in range(n)]
    src = _overlap(al.src_pieces, source, src_words)
    src /= np.maximum(src.sum(1, keepdims=True), 1e-12)  # a piece's attention is shared among its words
    tgt = _overlap(al.tgt_pieces, al.translation, tgt_words)
    tgt /= np.maximum(tgt.sum(0, keepdims=True), 1e-12)  # a word's attention is its pieces', by their share of it
    scores = tgt.T @ np.asarray(al.weights, dtype=np.float64) @ src  # (target words, source words)
    best = scores.argmax(1)
    return tgt_words, [int(b) if scores[t, b] > 0 else None for t, b in enumerate(best)]


@dataclass
class _Target:
    """A segment's translation as words, the whitespace before each, their alignment, and the sentences' spans."""

    words: list[str] = field(default_factory=list)
    space: list[str] = field(default_factory=list)  # space[t]: between words t-1 and t; space[n] = ""
    align: list[int | None] = field(default_factory=list)  # source word of each target word
    sentences: list[tuple[int, int, int, int]] = field(default_factory=list)  # source lo, hi, target lo, hi
    first: dict[int, int] = field(default_factory=dict)  # source word -> its first and last target word
    last: dict[int, int] = field(default_factory=dict)


def _target(src: _Source, aligned: list[Alignment]) -> _Target:
    """The sentences' translations joined with the source's whitespace between sentences."""
    tg = _Target()
    for k, ((a, b), (lo, hi), al) in enumerate(zip(src.sentences, src.sentence_words, aligned)):
        local = [(max(x, a) - a, min(y, b) - a) for x, y in src.words[lo:hi]]
        spans, align = align_words(src.text[a:b], local, al)
        start = len(tg.words)
        for j, (x, y) in enumerate(spans):
            if j:
                gap = al.translation[spans[j - 1][1] : x]
            else:
                gap = src.text[src.sentences[k - 1][1] : a] if k and start else ""
            tg.space.append(gap)
            tg.words.append(al.translation[x:y])
            tg.align.append(None if align[j] is None else lo + align[j])
        tg.sentences.append((lo, hi, start, len(tg.words)))
    tg.space.append("")
    for t, u in enumerate(tg.align):
        if u is not None:
            tg.first.setdefault(u, t)
            tg.last[u] = t
    return tg


def _gap_position(gap: int, tg: _Target) -> int:
    """Where a void at source gap `gap` goes: between the translations of the source words it stood between."""
    for lo, hi, t_lo, _ in tg.sentences:
        if gap <= lo:
            return t_lo
        if gap < hi:
            break
    else:
        return len(tg.words)
    left = next((u for u in range(gap - 1, lo - 1, -1) if u in tg.first), None)
    right = next((u for u in range(gap, hi) if u in tg.first), None)
    if right is not None and (left is None or tg.first[left] < tg.first[right]):
        return tg.first[right]
    if right is not None:  # the right word's translation comes first: the void follows it
        return tg.last[right] + 1
    return t_lo if left is None else tg.last[left] + 1


def _segmentation(labels: list[int | None], m: int) -> list[int]:
    """The best state of each word: 2k+1 inside the k-th child span, 2k in the gap before it (children in order)."""
    # A word scores when its state agrees with its label (-1: the parent itself); a word inside a child it does not
    # belong to costs a little, so that ties leave tags tight around their words. Of equal paths, the one with the
    # highest states, word by word, wins: an element torn apart by the translation keeps its earliest part.
    n, states = len(labels), 2 * m + 1
    big, index = n + 1, np.arange(states)
    inside = index % 2 == 1
    prev, back = np.zeros(states), np.zeros((n, states), dtype=np.int32)
    for i, lab in enumerate(labels):
        running = np.maximum.accumulate(prev)
        back[i] = np.maximum.accumulate(np.where(prev == running, index, 0))  # the highest state holding it
        if lab is None:
            match = np.zeros(states, dtype=bool)
        else:
            match = ~inside if lab == -1 else index == 2 * lab + 1
        prev = running + big * match - (inside & ~match)
    state = states - 1 - int(np.argmax(prev[::-1]))
    path = [0] * n
    for i in range(n - 1, -1, -1):
        path[i] = state
        state = int(back[i][state])
    return path


def _greedy(labels: list[int | None], m: int) -> list[int]:
    """States of a placement too large for the table: each child spans its first to last word, in order."""
    path, state = [], 0
    for lab in labels:
        if lab is not None and lab >= 0 and 2 * lab + 1 >= state:
            state = 2 * lab + 1
        elif state % 2:
            state += 1
        path.append(state)
    return path


def _labels(node: _Node, kids: list[_Node], s: int, e: int, tg: _Target):
    """Per target word in [s, e): the child its source word lies in, -1 for node itself, None for neither."""
    los, labels, seen = [c.lo for c in kids], [], defaultdict(list)
    for t in range(s, e):
        u = tg.align[t]
        k = bisect_right(los, u) - 1 if u is not None and node.lo <= u < node.hi else None
        if k is None:
            labels.append(None)
        elif k >= 0 and u < kids[k].hi:
            labels.append(k)
            seen[k].append(t)
        else:
            labels.append(-1)
    return labels, seen


def _place(node: _Node, s: int, e: int, tg: _Target, where: dict) -> None:
    """Give each descendant of node a span of target words within [s, e), or a gap (start == end)."""
    kids = [c for c in node.children if c.lo < c.hi]
    labels, seen = _labels(node, kids, s, e, tg)
    order = sorted(seen, key=lambda k: (seen[k][len(seen[k]) // 2], k))  # by the median of their words
    rank = {k: r for r, k in enumerate(order)}
    ranked = [rank[lab] if lab is not None and lab >= 0 else lab for lab in labels]
    fits = (e - s) * (2 * len(order) + 1) <= MAX_CELLS
    path = (_segmentation if fits else _greedy)(ranked, len(order)) if order else [0] * (e - s)
    placed = []
    for r, k in enumerate(order):
        inside = [s + i for i, state in enumerate(path) if state == 2 * r + 1]
        if inside:
            where[kids[k]] = (inside[0], inside[-1] + 1)
            placed.append((inside[0], inside[-1] + 1, kids[k]))
    for child in node.children:
        if child in where:
            _place(child, *where[child], tg, where)
            continue
        p = min(max(_gap_position(child.lo, tg), s), e)
        for a, b, sibling in placed:  # a void never lands inside a sibling
            if a < p < b:
                p = a if child.lo <= sibling.lo else b
        where[child] = (p, p)


def _emit_zero(node: _Node, out: list[Item], spaced: bool) -> None:
    """A node that has no target words: its tags and voids, its source text left out."""
    if spaced and node.before:
        out.append(Text(node.before))
    out.append(node.open)
    if node.close is not None:
        for child in node.children:
            _emit_zero(child, out, True)
        out.append(node.close)
    if spaced and node.after:
        out.append(Text(node.after))


def _emit_gap(space: str, zeros: list[_Node], out: list[Item]) -> None:
    """The whitespace between two words and the voids in that gap, which keep the whitespace they had."""
    own = any(z.before or z.after or z.open.space for z in zeros)
    for z in zeros:
        _emit_zero(z, out, True)
    if space and not own:
        out.append(Text(space))


def _render(node: _Node, s: int, e: int, tg: _Target, where: dict, out: list[Item]) -> None:
    """Node's target words [s, e) with its children's tags around theirs."""
    starts, zeros = {}, defaultdict(list)
    for child in node.children:
        a, b = where[child]
        if a < b:
            starts[a] = child
        else:
            zeros[a].append(child)
    p = s
    while True:
        _emit_gap(tg.space[p] if s < p < e else "", zeros.get(p, []), out)
        if p in starts:
            child = starts[p]
            out.append(child.open)
            _render(child, *where[child], tg, where, out)
            out.append(child.close)
            p = where[child][1]
            continue
        if p >= e:
            return
        out.append(Text(tg.words[p]))
        p += 1


def _has_letters(items: list[Item]) -> bool:
    return any(isinstance(i, Text) and LETTER.search(i.text) for i in items)


def translate_segments(
    segments: list[list[Item]], translate: Translate, split: Split | None = None
) -> list[list[Item] | None]:
    """Each segment (text and tags) translated with its tags put back; None for one with no letters to translate."""
    sources = [_source(items, split) if _has_letters(items) else None for items in segments]
    texts = [src.text[a:b] for src in sources if src is not None for a, b in src.sentences]
    results = translate(texts) if texts else []
    if len(results) != len(texts):
        raise ValueError(f"the translate function returned {len(results)} results for {len(texts)} sentences")
    out, at = [], 0
    for src in sources:
        if src is None:
            out.append(None)
            continue
        tg = _target(src, results[at : at + len(src.sentences)])
        at += len(src.sentences)
        where = {src.root: (0, len(tg.words))}
        _place(src.root, 0, len(tg.words), tg, where)
        items = [Text(src.lead)] if src.lead else []
        _render(src.root, 0, len(tg.words), tg, where, items)
        out.append(items + ([Text(src.trail)] if src.trail else []))
    return out


# HTML. Inline elements stay inside a sentence; any other tag ends it.
INLINE = frozenset(
    "a abbr acronym b bdi bdo big cite data del dfn em font i ins label mark q rb rp rt rtc ruby s small span strike "
    "strong sub sup time tt u".split()
)
INLINE_VOID = frozenset({"img", "wbr", "input"})  # inline, without content: kept where they stood
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())  # no end tag
# Elements whose content is not language: copied untouched, in a sentence (as a void) or between sentences.
OPAQUE_INLINE = frozenset({"code", "kbd", "samp", "script", "style", "svg", "math", "textarea"})
OPAQUE_BLOCK = frozenset({"pre", "template"})
SENTENCE_LEVEL = INLINE | INLINE_VOID | OPAQUE_INLINE
MAX_RESTARTS = 100  # places the standard parser gives up at, before the rest of a document is kept as it is


@dataclass(frozen=True)
class _Event:
    kind: str  # start, startend, end, data, other (comments, declarations, processing instructions)
    start: int  # offset in the document
    name: str = ""
    attrs: tuple = ()
    text: str = ""


class _EventParser(HTMLParser):
    """Records each piece of an HTML document with its offset, so that its raw text can be cut out exactly."""

    def __init__(self, base: int, newlines: list[int]):
        super().__init__(convert_charrefs=True)
        self.base, self.newlines, self.events = base, newlines, []

    def position(self) -> int:
        line, col = self.getpos()
        if line == 1:
            return self.base + col
        return self.newlines[bisect_left(self.newlines, self.base) + line - 2] + 1 + col

    def _add(self, kind, name="", attrs=(), text=""):
        self.events.append(_Event(kind, self.position(), name, tuple(attrs), text))

    def handle_starttag(self, tag, attrs):
        self._add("start", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._add("startend", tag, attrs)

    def handle_endtag(self, tag):
        self._add("end", tag)

    def handle_data(self, data):
        self._add("data", text=data)

    def handle_comment(self, data):
        self._add("other")

    handle_decl = handle_pi = unknown_decl = handle_comment

    def unclosed(self) -> bool:
        """After feed: whether it stopped at a comment, tag or declaration that nothing after it closes (not at a lone
        "<" at the end, which close() makes text, nor inside a script or style)."""
        return len(self.rawdata) > 1 and self.rawdata[0] == "<" and self.cdata_elem is None


def _html_events(doc: str) -> list[_Event]:
    """The document's pieces in order; where the standard parser gives up, the character it stopped at is text, and
    markup that never closes runs to the end of the document (as in HTML5), kept as it is."""
    newlines = [i for i, c in enumerate(doc) if c == "\n"]
    events, base = [], 0
    for _ in range(MAX_RESTARTS):
        parser = _EventParser(base, newlines)
        try:
            parser.feed(doc[base:])
            if parser.unclosed():  # close() would make it text and retry at each later "<", searching to the end
                return events + parser.events + [_Event("other", parser.position())]
            parser.close()
            return events + parser.events
        except Exception:  # e.g. AssertionError on "<![foo[" from _markupbase
            at = max(parser.position(), base)
            events += [*parser.events, _Event("data", at, text=doc[at])]
            base = at + 1
            if base == len(doc):
                return events
    return events + [_Event("other", base)]


def _opaque(event: _Event) -> bool:
    """Whether an element's content passes through untranslated (code, translate="no", class="notranslate")."""
    attrs = {k: (v or "") for k, v in event.attrs}
    return (
        event.name in OPAQUE_INLINE
        or event.name in OPAQUE_BLOCK
        or attrs.get("translate", "").strip().lower() == "no"
        or "notranslate" in attrs.get("class", "").split()
    )


def _region_end(events: list[_Event], i: int) -> int:
    """The index of the end tag that closes the element started at events[i] (the last event if none does)."""
    depth, name = 0, events[i].name
    for j in range(i + 1, len(events)):
        if events[j].name == name and events[j].kind in ("start", "end"):
            depth += 1 if events[j].kind == "start" else -1
            if depth < 0:
                return j
    return len(events) - 1


def _html_item(event: _Event, raw: str) -> Item | None:
    """What an event is inside a sentence, or None where it ends one."""
    if event.kind == "data":
        return Text(event.text)
    if event.kind == "other":
        return Tag("void", raw)
    if event.name in INLINE and event.kind in ("start", "end"):
        return Tag("open" if event.kind == "start" else "close", raw, event.name)
    if event.name in SENTENCE_LEVEL:
        return Tag("void", raw)
    return None


def html_parts(doc: str) -> list[str | tuple[list[Item], str]]:
    """The document as raw text between sentences and (items, raw) runs of inline content (sentences to translate)."""
    events = _html_events(doc)
    ends = [e.start for e in events[1:]] + [len(doc)]
    parts, items, start = [], [], None

    def flush(at: int) -> None:
        nonlocal items, start
        if items:
            parts.append((items, doc[start:at]))
        items, start = [], None

    i = 0
    while i < len(events):
        event, j = events[i], i
        if event.kind in ("start", "startend") and _opaque(event):
            j = _region_end(events, i) if event.kind == "start" and event.name not in VOID else i
            raw = doc[event.start : ends[j]]
            item = Tag("void", raw) if event.name in SENTENCE_LEVEL else None
        else:
            raw = doc[event.start : ends[i]]
            item = _html_item(event, raw)
        if item is None:
            flush(event.start)
            parts.append(raw)
        else:
            start = event.start if start is None else start
            items.append(item)
        i = j + 1
    flush(len(doc))
    return parts


def escape_html(text: str) -> str:
    """Text as HTML: &, < and > escaped, a no-break space written as &nbsp; so that it stays visible."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\xa0", "&nbsp;")


def translate_html(
    docs: list[str],
    translate: Translate,
    split: Split | None = None,
    parts: Callable[[str], list] | None = None,
    write: Callable[[Item], str] | None = None,
) -> list[str]:
    """HTML documents or fragments translated sentence by sentence, with their inline tags put back, all in one
    translate call. `parts` reads a document into raw text and runs of items (default html_parts), `write` writes a
    translated item (default: HTML, a no-break space as &nbsp;), for a dialect of HTML (EPUB's XHTML)."""
    parsed = [(parts or html_parts)(doc) for doc in docs]
    runs = [part for doc_parts in parsed for part in doc_parts if not isinstance(part, str)]
    done = iter(translate_segments([items for items, _ in runs], translate, split))
    out = []
    for doc_parts in parsed:
        pieces = []
        for part in doc_parts:
            if isinstance(part, str):
                pieces.append(part)
                continue
            items = next(done)
            pieces.append(part[1] if items is None else "".join(map(write or _html_text, items)))
        out.append("".join(pieces))
    return out


def _html_text(item: Item) -> str:
    return escape_html(item.text) if isinstance(item, Text) else str(item.raw)
