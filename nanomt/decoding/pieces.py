"""Sentences as the model reads them: a sentence too long for the model's positions cut into pieces that fit (and
their translations joined), SentencePiece pieces as text, and unknown source pieces put back by attention."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

# count_tokens(texts) -> the number of source tokens of each text (without EOS), as the model's tokenizer counts.
TokenCounter = Callable[[list[str]], list[int]]

_CLAUSE_END = re.compile(r"[,;:\u2013\u2014](?=\s)|[\uff0c\uff1b\uff1a\u3001]")
_WORD = re.compile(r"\S+")
# A SentencePiece piece is at most 16 characters long (max_sentencepiece_length): bounds a window's search.
_MAX_PIECE_CHARS = 16
SPECIAL_PIECES = frozenset({"<s>", "</s>", "<pad>"})  # pieces that stand for no characters


def cut_sentence(text: str, max_tokens: int, count_tokens: TokenCounter) -> list[str]:
    """`text` in pieces of at most `max_tokens` tokens (a piece of one character excepted), holding every character
    but the whitespace between them: at clause punctuation where there is some, else between words, else by windows."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    a, b = stripped(text, 0, len(text))
    if a == b:
        return []
    if count_tokens([text[a:b]])[0] <= max_tokens:
        return [text[a:b]]
    return [text[x:y] for x, y, _ in cut_span(text, a, b, max_tokens, count_tokens)]


def stripped(text: str, a: int, b: int) -> tuple[int, int]:
    """text[a:b] without the whitespace around it, as (start, end); empty where it is all whitespace."""
    piece = text[a:b]
    left = a + len(piece) - len(piece.lstrip())
    return left, max(left, a + len(piece.rstrip()))


def cut_span(text: str, a: int, b: int, budget: int, count: TokenCounter) -> list[tuple[int, int, int]]:
    """(start, end, tokens) pieces of at most `budget` tokens covering text[a:b]'s words, as few as packing allows."""
    # Cut at clause punctuation where there is some, else between words, else by windows of characters.
    chunks = _clauses(text, a, b)
    if len(chunks) < 2:
        chunks = [m.span() for m in _WORD.finditer(text, a, b)]
    if len(chunks) < 2:
        return _windows(text, a, b, budget, count)
    items = []
    for (x, y), n in zip(chunks, count([text[x:y] for x, y in chunks])):
        items += [(x, y, n)] if n <= budget else cut_span(text, x, y, budget, count)
    return _verified(text, _pack(items, budget), budget, count)


def _clauses(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """text[a:b] cut after each clause mark, each part without the whitespace around it."""
    cuts = [a] + [m.end() for m in _CLAUSE_END.finditer(text, a, b)] + [b]
    parts = [stripped(text, x, y) for x, y in zip(cuts, cuts[1:])]
    return [(x, y) for x, y in parts if x < y]


def _pack(items: list[tuple[int, int, int]], budget: int) -> list[list[tuple[int, int, int]]]:
    """Consecutive items grouped greedily while their summed tokens stay within `budget`."""
    groups, total = [[items[0]]], items[0][2]
    for item in items[1:]:
        if total + item[2] > budget:
            groups.append([])
            total = 0
        groups[-1].append(item)
        total += item[2]
    return groups


def _verified(
    text: str, groups: list[list[tuple[int, int, int]]], budget: int, count: TokenCounter
) -> list[tuple[int, int, int]]:
    """Each group as one piece, counted whole; a group over budget (subwords are not additive everywhere) halved."""
    pieces = []
    for group, n in zip(groups, count([text[g[0][0] : g[-1][1]] for g in groups])):
        if n <= budget or len(group) == 1:
            pieces.append((group[0][0], group[-1][1], n))
        else:
            half = len(group) // 2
            pieces += _verified(text, [group[:half], group[half:]], budget, count)
    return pieces


def _windows(text: str, a: int, b: int, budget: int, count: TokenCounter) -> list[tuple[int, int, int]]:
    """text[a:b] (no space or clause mark in it) as the longest character windows of at most `budget` tokens."""
    pieces = []
    while a < b:
        lo, hi = 1, min(b - a, budget * _MAX_PIECE_CHARS)
        n_hi = count([text[a : a + hi]])[0]
        if n_hi <= budget:
            lo, n_lo = hi, n_hi
        else:
            n_lo = count([text[a : a + 1]])[0]  # one character is taken even over budget: the text must advance
            while hi - lo > 1:
                mid = (lo + hi) // 2
                n = count([text[a : a + mid]])[0]
                lo, n_lo, hi = (mid, n, hi) if n <= budget else (lo, n_lo, mid)
        pieces.append((a, a + lo, n_lo))
        a += lo
    return pieces


def replace_unknowns(
    src_pieces: Sequence[str],
    tgt_pieces: Sequence[str],
    attention: np.ndarray,
    src_unknown: Sequence[int] = (),
    unk: str = "<unk>",
) -> list[str]:
    """Target pieces with each `unk` the source piece it attends to most, and no unknown source piece dropped."""
    # CTranslate2's replace_unknowns, and more: each unknown source piece (positions `src_unknown`) that no target
    # `unk` took is put in before the target piece attending to it most. `attention` is (T, S): per target piece,
    # weights over the source pieces (Translator.attention's cross weights, one layer, heads averaged);
    # `src_pieces` are surface strings (SentencePiece's encode(..., out_type=str)).
    weights = np.asarray(attention, dtype=np.float64)
    if weights.shape != (len(tgt_pieces), len(src_pieces)):
        expected = (len(tgt_pieces), len(src_pieces))
        raise ValueError(f"attention is {weights.shape}, expected (target pieces, source pieces) = {expected}")
    real = np.array([p not in SPECIAL_PIECES for p in src_pieces])
    if not real.any():
        return list(tgt_pieces)
    masked = np.where(real, weights, -np.inf)  # (T, S): never align to </s>
    out = list(tgt_pieces)
    taken = set()
    for i, piece in enumerate(tgt_pieces):
        if piece == unk:
            j = int(masked[i].argmax())
            out[i] = src_pieces[j]
            taken.add(j)
    insert_at = {}  # target position -> unknown source positions to put before it
    for j in sorted(set(src_unknown) - taken):
        insert_at.setdefault(int(weights[:, j].argmax()), []).append(j)
    result = []
    for i, piece in enumerate(out):
        result += [_word_piece(src_pieces, j) for j in insert_at.get(i, ())] + [piece]
    return result


def _word_piece(src_pieces: Sequence[str], j: int) -> str:
    """Source piece j, marked as a word's start (▁) where it starts one in the source."""
    starts_word = j == 0 or src_pieces[j - 1] == "\u2581" or src_pieces[j].startswith("\u2581")
    return "\u2581" + src_pieces[j].lstrip("\u2581") if starts_word else src_pieces[j]


def join_pieces(pieces: Sequence[str]) -> str:
    """SentencePiece pieces (▁ marks a word's start) as text, special pieces left out."""
    return "".join(p for p in pieces if p not in SPECIAL_PIECES).replace("\u2581", " ").strip()
