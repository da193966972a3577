"""Train and load SentencePiece subword models: one shared by both languages, or one per language."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

# The special ids (config.py) are reserved in every SentencePiece model, so the model and the data agree.
from nanomt.core.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataConfig, ModelConfig

SHARED_FILE, SRC_FILE, TGT_FILE = "spm.model", "src.model", "tgt.model"
# Id tables that replace SentencePiece's own ids (Marian's layout): one over both sides, or the target's own.
VOCAB_FILE, TGT_VOCAB_FILE = "vocab.json", "target_vocab.json"
# The pieces an id table names its padding, unknown and end-of-sentence ids by.
TABLE_SPECIALS = {"pad": "<pad>", "unk": "<unk>", "eos": "</s>"}
# A multilingual model's target-language token (Marian's >>fra<<, Johnson et al. 2017's <2es>): one source piece
# that starts the source and names the language to translate into.
LANGUAGE_TOKEN = re.compile(r">>([^<>\s]+)<<")
LANGUAGE_START = re.compile(r"\s*>>([^<>\s]+)<<")
SEED = 1


class Tokenizer:
    """One shared SentencePiece model, or one per language."""

    def __init__(
        self,
        src_model: bytes,
        tgt_model: bytes | None = None,
        vocab: dict[str, int] | None = None,
        tgt_vocab: dict[str, int] | None = None,
    ):
        """`tgt_model=None`: the source model is shared by both sides; `vocab`: an id table (see `IdTable`)."""
        self._src_bytes = src_model
        self._tgt_bytes = tgt_model
        self._src = spm.SentencePieceProcessor(model_proto=src_model)
        self._tgt = self._src if tgt_model is None else spm.SentencePieceProcessor(model_proto=tgt_model)
        self._src_table = None if vocab is None else IdTable(vocab)
        self._tgt_table = self._src_table if tgt_vocab is None else IdTable(tgt_vocab)
        if tgt_vocab is not None and vocab is None:
            raise ValueError("a target id table needs a source one (vocab)")
        table = self._src_table
        if table is None:
            for sp in (self._src, self._tgt):
                ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
                if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
                    raise ValueError(f"SentencePiece model has special ids {ids}, expected (0, 1, 2, 3)")
        elif (table.pad_id, table.eos_id) != (self._tgt_table.pad_id, self._tgt_table.eos_id):
            raise ValueError("the source and target id tables must agree on the ids of </s> and <pad>")
        specials = (PAD_ID, UNK_ID, EOS_ID) if table is None else (table.pad_id, table.unk_id, table.eos_id)
        self.pad_id, self.unk_id, self.eos_id = specials
        # A table has no <s>: the decoder starts from the id the model's config names (Marian: the pad id).
        self.bos_id = BOS_ID if table is None else None
        pieces = table.pieces if table is not None else map(self._src.id_to_piece, range(self._src.get_piece_size()))
        tokens = {m.group(1): i for i, p in enumerate(pieces) if (m := LANGUAGE_TOKEN.fullmatch(p))}
        self.target_codes = tuple(tokens)  # the languages a multilingual model translates into, in vocabulary order
        self._language_ids = tokens

    def language_token(self, code: str | None) -> list[int]:
        """The source ids that start a sentence to translate into `code` (fra or >>fra<<): one token for a
        multilingual model, none for a model of one target language. ValueError, naming the codes the model has,
        for a multilingual model without a code or with one it lacks, and for a code given to any other model."""
        if code is not None:
            code = m.group(1) if (m := LANGUAGE_TOKEN.fullmatch(code)) else code
        if not self.target_codes:
            if code is None:
                return []
            raise ValueError(f"target language {code!r}: this model translates into one language and takes no code")
        if code in self._language_ids:
            return [self._language_ids[code]]
        what = "needs a target language" if code is None else f"has no target language {code!r}"
        raise ValueError(f"this multilingual model {what}; its codes: {', '.join(self.target_codes)}")

    def split_language(self, texts: list[str], code: str | None) -> tuple[list[list[int]], list[str]]:
        """Each text's language-token ids and the text to encode: `code`'s token for every text where a code is
        given; else, for a multilingual model, the >>code<< each text starts with (as Marian's users write them),
        taken off the text. ValueError for a multilingual model's text with neither (a blank one needs none) or
        with both, and for a code given to any other model."""
        if not self.target_codes or code is not None:
            tagged = next((i for i, t in enumerate(texts) if self._lead(t)[0]), None)  # none without codes
            if tagged is not None:
                raise ValueError(f"text {tagged + 1} starts with its own language token: give the target language once")
            return [self.language_token(code)] * len(texts), list(texts)
        split = [self._lead(t) for t in texts]
        if any(not lead and text.strip() for text, (lead, _) in zip(texts, split)):
            self.language_token(None)  # the refusal that names the codes
        return [lead for lead, _ in split], [rest for _, rest in split]

    def _lead(self, text: str) -> tuple[list[int], str]:
        """A text's leading language token (its id, where it names one of the model's targets) and the rest."""
        m = LANGUAGE_START.match(text)
        if m is None or m.group(1) not in self._language_ids:
            return [], text
        return [self._language_ids[m.group(1)]], text[m.end() :]

    def _leads(self, texts: list[str]) -> tuple[list[list[int]], list[str]]:
        leads = [self._lead(t) for t in texts]
        return [lead for lead, _ in leads], [rest for _, rest in leads]

    def check_model_ids(self, cfg: ModelConfig) -> None:
        """The model's pad and end-of-sentence ids (and decoder-start id, where it has one) are the tokenizer's."""
        ours = {"pad_id": self.pad_id, "eos_id": self.eos_id, "bos_id": self.bos_id}
        for name, tokenizer_id in ours.items():
            if tokenizer_id is not None and getattr(cfg, name) != tokenizer_id:
                raise ValueError(f"model.{name} is {getattr(cfg, name)}, but the tokenizer's is {tokenizer_id}")

    @property
    def shared(self) -> bool:
        """True when both languages use the same model (and vocabulary)."""
        return self._tgt_bytes is None

    @property
    def src_vocab_size(self) -> int:
        return self._src.get_piece_size() if self._src_table is None else len(self._src_table.pieces)

    @property
    def tgt_vocab_size(self) -> int:
        return self._tgt.get_piece_size() if self._tgt_table is None else len(self._tgt_table.pieces)

    def encode_src(self, texts: list[str], dropout: float = 0.0) -> list[list[int]]:
        """Source sentences to ids, without BOS/EOS; `dropout` > 0 samples a BPE-dropout segmentation."""
        if self._src_table is not None:
            return self._src_table.encode(self._src, texts, dropout)
        if not self.target_codes:
            return _encode(self._src, texts, dropout)
        # A multilingual model's training text starts with its >>code<<: one token, never SentencePiece's pieces.
        leads, rests = self._leads(texts)
        return [lead + ids for lead, ids in zip(leads, _encode(self._src, rests, dropout))]

    def encode_tgt(self, texts: list[str], dropout: float = 0.0) -> list[list[int]]:
        """Target sentences to ids, without BOS/EOS; `dropout` > 0 samples a BPE-dropout segmentation."""
        if self._tgt_table is not None:
            return self._tgt_table.encode(self._tgt, texts, dropout)
        return _encode(self._tgt, texts, dropout)

    def dropout_encoder(self, side: str, dropout: float) -> Callable[[list[str]], list[list[int]]]:
        """Encodes successive lists of `side` ("src"/"tgt") sentences with BPE-dropout, drawing the ids that one
        encode_src/encode_tgt call on all of them would: one SentencePiece thread, kept across the calls, whose
        sampler starts from the seed set (set_sampling_seed) before the first call."""
        sp = self._src if side == "src" else self._tgt
        pool = spm.ThreadPool(1)  # a new pool each call would restart the sampler from the seed
        encode = lambda texts: sp.encode(  # noqa: E731
            list(texts), out_type=int, enable_sampling=True, alpha=dropout, num_threads=1, thread_pool=pool
        )
        if side == "tgt" or not self.target_codes:
            return encode

        def tagged(texts: list[str]) -> list[list[int]]:
            leads, rests = self._leads(list(texts))
            return [lead + ids for lead, ids in zip(leads, encode(rests))]

        return tagged

    def decode_src(self, ids: list[list[int]]) -> list[str]:
        """Source ids (without specials) to text."""
        if self._src_table is not None:
            return [_join_pieces(self._src, self.src_pieces(seq)) for seq in ids]
        return [self._src.decode([int(i) for i in seq]) for seq in ids]

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Target ids to text; PAD/BOS/EOS are skipped (with an id table, UNK too, as Marian's tokenizer does)."""
        special = (PAD_ID, BOS_ID, EOS_ID) if self._tgt_table is None else (self.pad_id, self.eos_id, self.unk_id)
        kept = [[i for i in map(int, seq) if i not in special] for seq in ids]
        if self._tgt_table is not None:
            return [_join_pieces(self._tgt, self.tgt_pieces(seq)) for seq in kept]
        return [self._tgt.decode(seq) for seq in kept]

    def src_piece_texts(self, texts: list[str]) -> list[list[str]]:
        """Each text's source pieces as strings, one per id of encode_src: a piece the vocabulary lacks is its text."""
        if self._src_table is None and self.target_codes:
            leads, rests = self._leads(texts)
            pieces = _encode(self._src, rests, 0.0, out_type=str)
            return [self.src_pieces(lead) + ps for lead, ps in zip(leads, pieces)]
        if self._src_table is None:
            return _encode(self._src, texts, 0.0, out_type=str)
        tags, rests = zip(*map(_split_tag, texts)) if texts else ((), ())
        return [list(tag) + ps for tag, ps in zip(tags, _encode(self._src, list(rests), 0.0, out_type=str))]

    def src_pieces(self, ids: list[int]) -> list[str]:
        """Source ids to their subword strings (for attention plots)."""
        if self._src_table is not None:
            return [self._src_table.pieces[int(i)] for i in ids]
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        """Target ids to their subword strings (for attention plots)."""
        if self._tgt_table is not None:
            return [self._tgt_table.pieces[int(i)] for i in ids]
        return [self._tgt.id_to_piece(int(i)) for i in ids]

    def fingerprint(self) -> str:
        """sha256 of the model file(s): a cache key that changes whenever the vocabulary does."""
        parts = [self._src_bytes] if self.shared else [self._src_bytes, self._tgt_bytes]
        parts += [_table_bytes(t.ids) for t in dict.fromkeys((self._src_table, self._tgt_table)) if t is not None]
        return hashlib.sha256("".join(hashlib.sha256(p).hexdigest() for p in parts).encode()).hexdigest()

    def save(self, directory: str | Path) -> None:
        """Write spm.model (shared) or src.model + tgt.model (each with a readable .vocab) to directory."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        models = [(SHARED_FILE, self._src_bytes, self._src)]
        if not self.shared:
            models = [(SRC_FILE, self._src_bytes, self._src), (TGT_FILE, self._tgt_bytes, self._tgt)]
        for name, data, sp in models:
            vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))
            _write_atomic(directory / Path(name).with_suffix(".vocab").name, vocab.encode("utf-8"))
            _write_atomic(directory / name, data)
        _remove_other_kind(directory, self.shared)
        tables = {VOCAB_FILE: self._src_table}
        tables[TGT_VOCAB_FILE] = self._tgt_table if self._tgt_table is not self._src_table else None
        for name, table in tables.items():
            if table is None:
                (directory / name).unlink(missing_ok=True)
            else:
                _write_atomic(directory / name, _table_bytes(table.ids))

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Load spm.model (shared) or src.model + tgt.model from `directory`."""
        directory = Path(directory)
        shared = directory / SHARED_FILE
        src, tgt = directory / SRC_FILE, directory / TGT_FILE
        if shared.is_file() and (src.is_file() or tgt.is_file()):
            raise ValueError(f"{directory}: holds both {SHARED_FILE} and {SRC_FILE}/{TGT_FILE}; keep one")
        tables = [_read_table(directory / name) for name in (VOCAB_FILE, TGT_VOCAB_FILE)]
        if shared.is_file():
            return cls(shared.read_bytes(), None, *tables)
        if src.is_file() and tgt.is_file():
            return cls(src.read_bytes(), tgt.read_bytes(), *tables)
        raise FileNotFoundError(
            f"{directory}: no tokenizer found (expected {SHARED_FILE}, or {SRC_FILE} and {TGT_FILE})"
        )


class IdTable:
    """Ids of pieces by a table (Marian's vocab.json) rather than by SentencePiece's own numbering."""

    # Marian gives both languages' SentencePiece models one table, so that a piece has one id on either side;
    # the table's ids run 0..len-1 and name the special pieces in TABLE_SPECIALS.

    def __init__(self, ids: dict[str, int]):
        self.ids = dict(ids)
        self.pieces = [""] * len(ids)
        for piece, i in ids.items():
            if not 0 <= i < len(ids) or self.pieces[i]:
                raise ValueError(f"id table: id {i} of {piece!r} is repeated or outside 0..{len(ids) - 1}")
            self.pieces[i] = piece
        missing = [p for p in TABLE_SPECIALS.values() if p not in ids]
        if missing:
            raise ValueError(f"id table has no {missing[0]!r} piece")
        self.pad_id, self.unk_id, self.eos_id = (ids[TABLE_SPECIALS[k]] for k in ("pad", "unk", "eos"))

    def encode(self, sp: spm.SentencePieceProcessor, texts: list[str], dropout: float) -> list[list[int]]:
        """Texts to table ids; a leading language tag such as >>fra<< is one piece, as Marian's tokenizer has it."""
        tags, rests = zip(*map(_split_tag, texts)) if texts else ((), ())
        pieces = _encode(sp, list(rests), dropout, out_type=str)
        return [[self.ids.get(p, self.unk_id) for p in tag + ps] for tag, ps in zip(tags, pieces)]


def language_of(text: str, code: str | None) -> str | None:
    """The language a sentence is translated into, by its code: `code` (fra or >>fra<<), else the >>code<< the
    text starts with; None for neither."""
    if code is not None:
        return m.group(1) if (m := LANGUAGE_TOKEN.fullmatch(code)) else code
    return m.group(1) if (m := LANGUAGE_START.match(text)) else None


def _join_pieces(sp: spm.SentencePieceProcessor, pieces: list[str]) -> str:
    """Pieces to text; a table's pieces may be the other language's, which `sp` passes through with their ▁."""
    return sp.decode_pieces(pieces).replace("\u2581", " ").strip()


def _split_tag(text: str) -> tuple[list[str], str]:
    """'>>fra<< text' -> (['>>fra<<'], ' text'); text without a tag -> ([], text)."""
    end = text.find("<<") if text.startswith(">>") else -1
    return ([text[: end + 2]], text[end + 2 :]) if end != -1 else ([], text)


def _table_bytes(ids: dict[str, int]) -> bytes:
    return json.dumps(ids, ensure_ascii=False, indent=1).encode("utf-8")


def _read_table(path: Path) -> dict[str, int] | None:
    """An id table file as a dict, None if there is none."""
    if not path.is_file():
        return None
    table = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(table, dict) or not all(isinstance(i, int) for i in table.values()):
        raise ValueError(f"{path}: an id table must map pieces to integer ids")
    return table


def _encode(sp: spm.SentencePieceProcessor, texts: list[str], dropout: float, out_type: type = int) -> list[list]:
    if not dropout:
        return sp.encode(list(texts), out_type=out_type, num_threads=_threads())
    # One thread: SentencePiece's sampler draws from a per-thread generator, so only a single thread makes
    # the segmentation a function of set_sampling_seed (and a resumed run see the same epoch).
    return sp.encode(list(texts), out_type=out_type, enable_sampling=True, alpha=dropout, num_threads=1)


def set_sampling_seed(seed: int) -> None:
    """Seed SentencePiece's sampler (process-wide): the next dropout encodings are a function of `seed`."""
    spm.set_random_generator_seed(seed % 2**32)  # SentencePiece takes an unsigned 32-bit seed


def _threads() -> int:
    return os.cpu_count() or 1


def _remove_other_kind(directory: Path, shared: bool) -> None:
    """Delete stale model files of the other layout, so `load` is never ambiguous."""
    stale = (SRC_FILE, TGT_FILE) if shared else (SHARED_FILE,)
    for name in stale:
        for path in (directory / name, (directory / name).with_suffix(".vocab")):
            path.unlink(missing_ok=True)


def _nonempty(sentences: Iterable[str]) -> Iterator[str]:
    return (s for s in sentences if s and not s.isspace())


def _write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name and rename, so a crash never leaves a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _train_one(sentences: Iterator[str], cfg: DataConfig, symbols: tuple[str, ...] = ()) -> bytes:
    """Train one SentencePiece model and return its serialized bytes; `symbols` are pieces of their own (a
    multilingual model's >>code<< tokens)."""
    first = next(sentences, None)
    if first is None:
        raise ValueError("no sentences to train the tokenizer on")
    # SentencePiece samples with its own RNG; a fixed seed makes the vocabulary reproducible.
    spm.set_random_generator_seed(SEED)
    # Written to memory, not to a model_prefix: the prefix would be stored in the model and change its hash.
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], sentences),
            model_writer=model,
            model_type=cfg.tokenizer,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            # Reservoir-sample at most this many sentences, so memory stays bounded on big corpora.
            input_sentence_size=cfg.tokenizer_sentences,
            shuffle_input_sentence=True,
            num_threads=_threads(),
            user_defined_symbols=list(symbols),
            minloglevel=2,
        )
    except RuntimeError as e:
        limit = re.search(r"value <= (\d+)", str(e))
        if limit:
            raise ValueError(
                f"vocab_size {cfg.vocab_size} is too large for this corpus; "
                f"SentencePiece can make at most {limit.group(1)} (set data.vocab_size lower)"
            ) from None
        raise ValueError(f"SentencePiece training failed: {str(e).splitlines()[0]}") from None
    return model.getvalue()


def train_tokenizer(
    src_sentences: Iterable[str], tgt_sentences: Iterable[str], out_dir: str | Path, cfg: DataConfig
) -> Tokenizer:
    """Train SentencePiece on the corpus and write spm.model (shared) or src.model + tgt.model to out_dir; a
    multilingual corpus' target-language tokens are source pieces of their own."""
    tokens = tuple(f">>{code}<<" for code in cfg.target_languages)
    if cfg.shared_vocab:
        tokenizer = Tokenizer(_train_one(_nonempty(itertools.chain(src_sentences, tgt_sentences)), cfg, tokens))
    else:
        src = _train_one(_nonempty(src_sentences), cfg, tokens)
        tokenizer = Tokenizer(src, _train_one(_nonempty(tgt_sentences), cfg))
    tokenizer.save(out_dir)
    return tokenizer
