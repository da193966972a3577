"""Sentences as the rows a model decodes: each sentence's source ids (a long one in pieces), its forced prefix and
its glossary terms, and each sentence's hypotheses joined back from its rows'."""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass

import torch

from nanomt.core.config import Config
from nanomt.core.decoding import Decoding
from nanomt.core.tokenizer import Tokenizer
from nanomt.decoding.glossary import required_terms
from nanomt.decoding.pieces import cut_sentence
from nanomt.decoding.steps import Hypothesis

log = logging.getLogger("nanomt")


def src_limit(cfg: Config) -> int:
    """The most source tokens one decoded row holds (its EOS takes the last position): a longer sentence is cut."""
    return cfg.model.max_positions - 1


@dataclass(frozen=True)
class Prepared:
    """Sentences as the rows the model decodes: a sentence over the length limit is several rows, its pieces."""

    src: list[list[int]]  # per row, its source ids and EOS ([] for an empty line)
    prefix: list[list[int]]  # per row, its forced target prefix (a cut sentence's first piece gets the sentence's)
    phrases: list[list[list[int]]]  # per row, the glossary terms its translation must contain
    sentence_of: list[int]  # per row, the sentence it is (a piece of)
    cut: list[int]  # the sentences longer than the limit, decoded in pieces and joined: no input is ever cut off
    lead: list[int]  # per row, how many of its first source ids are a target-language token (aligned to no word)


def _rows(
    tokenizer: Tokenizer, cfg: Config, sentences: list[str], leads: list[list[int]]
) -> tuple[list[str], list[list[int]], list[int]]:
    """Row texts, their source ids (EOS not yet added, each sentence's `leads`, a target-language token, first)
    and their sentences: each long sentence in pieces, each piece with its sentence's lead."""
    ids = tokenizer.encode_src(sentences)
    count = lambda texts: [len(x) for x in tokenizer.encode_src(texts)]  # noqa: E731
    texts, rows, owner = [], [], []
    for i, (sentence, sentence_ids, lead) in enumerate(zip(sentences, ids, leads)):
        limit = src_limit(cfg) - len(lead)
        pieces = [sentence] if len(sentence_ids) <= limit else cut_sentence(sentence, limit, count)
        piece_ids = [sentence_ids] if len(pieces) == 1 and pieces[0] is sentence else tokenizer.encode_src(pieces)
        # a piece of one character over the limit (a character of many byte pieces) keeps what fits
        texts += pieces
        rows += [lead + p[:limit] if p else [] for p in piece_ids]
        owner += [i] * len(pieces)
    return texts, rows, owner


def prepare(
    tokenizer: Tokenizer, cfg: Config, sentences: list[str], decoding: Decoding, prefixes: list[str] | None
) -> Prepared:
    """The rows to decode; ValueError naming what does not fit (a prefix past its sentence's length limit, a term
    the vocabulary cannot write, a multilingual model's target language missing); TypeError for what is no list of
    str (one str would be translated a character at a time)."""
    if isinstance(sentences, str):
        raise TypeError("sentences: a list of str, got one str (translate [text] for one sentence)")
    bad = next((i for i, s in enumerate(sentences) if not isinstance(s, str)), None)
    if bad is not None:
        raise TypeError(f"sentence {bad + 1} is a {type(sentences[bad]).__name__}, not a str")
    leads, sentences = tokenizer.split_language(sentences, decoding.target_lang)
    texts, rows, owner = _rows(tokenizer, cfg, sentences, leads)
    cut = sorted({i for k, i in enumerate(owner) if k > 0 and owner[k - 1] == i})
    if cut:
        log.info("%d sentence(s) longer than %d tokens translated in pieces", len(cut), src_limit(cfg))
    wanted = prefix_ids(tokenizer, prefixes, len(sentences))
    targets = [wanted[i] if k == 0 or owner[k - 1] != i else [] for k, i in enumerate(owner)]
    ids = [r + [cfg.model.eos_id] if r else [] for r in rows]
    for src, prefix, i in zip(ids, targets, owner):
        budget = decoding.max_len(len(src) - 1, cfg.model.max_positions)
        if src and prefix and len(prefix) >= budget:
            raise ValueError(
                f"sentence {i + 1}: its prefix of {len(prefix)} tokens does not fit its length limit ({budget})"
            )
    lead = [len(leads[i]) if row else 0 for row, i in zip(rows, owner)]
    return Prepared(ids, targets, phrase_ids(tokenizer, texts, decoding), owner, cut, lead)


def joined(rows: list[list[Hypothesis]], sentence_of: list[int], n: int) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses from its rows': the k-th joins every piece's k-th (or last), scores summed."""
    pieces: list[list[list[Hypothesis]]] = [[] for _ in range(n)]
    for hyps, i in zip(rows, sentence_of):
        pieces[i].append(hyps)
    out = []
    for parts in pieces:
        if len(parts) == 1:
            out.append(parts[0])
            continue
        depth = max(len(hyps) for hyps in parts)
        chosen = [[hyps[min(k, len(hyps) - 1)] for hyps in parts] for k in range(depth)]
        out.append(
            [
                Hypothesis(
                    tokens=[t for h in hs for t in h.tokens],
                    score=sum(h.score for h in hs),
                    log_prob=sum(h.log_prob for h in hs),
                    terms_missed=any(h.terms_missed for h in hs),
                )
                for hs in chosen
            ]
        )
    return out


def prefix_ids(tokenizer: Tokenizer, prefixes: list[str] | None, n: int) -> list[list[int]]:
    """Each sentence's forced target prefix as ids ([] for none)."""
    if prefixes is None:
        return [[] for _ in range(n)]
    if len(prefixes) != n:
        raise ValueError(f"{len(prefixes)} prefixes for {n} sentences")
    return [ids if p else [] for p, ids in zip(prefixes, tokenizer.encode_tgt([p or "" for p in prefixes]))]


def phrase_ids(tokenizer: Tokenizer, sentences: list[str], decoding: Decoding) -> list[list[list[int]]]:
    """Per sentence, the target ids of each glossary term its translation must contain."""
    if not decoding.glossary:
        return [[] for _ in sentences]
    terms = [required_terms(decoding.glossary, s) for s in sentences]
    unique = sorted({t for ts in terms for t in ts})
    ids = dict(zip(unique, tokenizer.encode_tgt(unique)))
    for term in unique:
        if not ids[term] or tokenizer.unk_id in ids[term]:
            raise ValueError(f"glossary term {term!r}: the model's vocabulary cannot write it (unknown pieces)")
    return [[ids[t] for t in ts] for ts in terms]


def word_starts(tokenizer: Tokenizer, vocab_size: int, eos_id: int) -> torch.Tensor:
    """(V,) True where a target piece starts a word (SentencePiece's "▁"), is punctuation only, or is EOS."""
    # The tokens after which a glossary term counts as a whole word (nanomt.decoding.constrained).
    pieces = tokenizer.tgt_pieces(list(range(min(vocab_size, tokenizer.tgt_vocab_size))))
    punctuation = lambda p: bool(p) and all(unicodedata.category(c).startswith("P") for c in p)  # noqa: E731
    starts = torch.zeros(vocab_size, dtype=torch.bool)
    starts[: len(pieces)] = torch.tensor([p.startswith("▁") or punctuation(p) for p in pieces], dtype=torch.bool)
    starts[eos_id] = True
    return starts
