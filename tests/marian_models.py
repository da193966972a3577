"""Small random Marian models made here (no download), saved as save_pretrained saves them: the multilingual one
(opus-mt-en-ROMANCE's layout, its >>code<< tokens in the vocabulary) that the import's and the server's tests share."""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm
import torch


def sentencepiece_model(path: Path, vocab_size: int, **options) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(input=str(path), model_writer=model, vocab_size=vocab_size, minloglevel=2, **options)
    return model.getvalue()


def pieces(model: bytes) -> list[str]:
    sp = spm.SentencePieceProcessor(model_proto=model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]


def id_table(*models: bytes, pad_last: bool) -> dict[str, int]:
    """vocab.json as Marian's conversion writes it: </s> 0, <unk> 1, the pieces, <pad> (last, or at 2)."""
    table = {"</s>": 0, "<unk>": 1} if pad_last else {"</s>": 0, "<unk>": 1, "<pad>": 2}
    for model in models:
        for piece in pieces(model):
            table.setdefault(piece, len(table))
    table.setdefault("<pad>", len(table))
    return table


def opus_mt_tokenizer(
    out: Path, corpus: dict[str, Path], shared: bool = True, codes: tuple[str, ...] = ()
) -> dict[str, dict[str, int]]:
    """source.spm and target.spm trained on `corpus`, their id tables and the tokenizer's files in `out`, as
    MarianTokenizer.save_pretrained writes them. Shared: one table over both models, a >>code<< token for each of
    `codes` and <pad> last (the layout of the opus-mt models); else Marian's separate_vocabs, a table a side."""
    import transformers

    src, tgt = sentencepiece_model(corpus["train.src"], 60), sentencepiece_model(corpus["train.tgt"], 70)
    (out / "source.spm").write_bytes(src)
    (out / "target.spm").write_bytes(tgt)
    files = {"source_spm": str(out / "source.spm"), "target_spm": str(out / "target.spm")}
    if shared:
        table = {k: v for k, v in id_table(src, tgt, pad_last=True).items() if k != "<pad>"}
        for code in codes:
            table[f">>{code}<<"] = len(table)
        tables = {"vocab": {**table, "<pad>": len(table)}}
    else:  # a table per side, which must agree on </s> and <pad>
        tables = {"vocab": id_table(src, pad_last=False), "target_vocab_file": id_table(tgt, pad_last=False)}
    for name, table in tables.items():
        files[name] = str(out / ("vocab.json" if name == "vocab" else "target_vocab.json"))
        Path(files[name]).write_text(json.dumps(table), encoding="utf-8")
    transformers.MarianTokenizer(**files, separate_vocabs=not shared).save_pretrained(out)
    return tables


def multilingual_marian(out: Path, corpus: dict[str, Path], codes: tuple[str, ...], max_new: int) -> Path:
    """A random multilingual MarianMTModel in `out`: one table over both sides with a >>code<< token for each of
    `codes` before <pad>, weights far from their initialization (so that the code changes the translation)."""
    table = opus_mt_tokenizer(out, corpus, codes=codes)["vocab"]
    return saved_random(small_config(len(table), table["<pad>"]), out, seed=2, max_new=max_new)


def small_config(vocab_size: int, pad: int, **changes):
    """A MarianConfig of a few thousand weights: 2 + 2 layers of width 16; `changes` are other fields."""
    import transformers

    fields = dict(
        vocab_size=vocab_size,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=None,  # nanomt cuts a translation at its max length without forcing EOS there
    )
    return transformers.MarianConfig(**{**fields, **changes})


def saved_random(cfg, out: Path, seed: int, max_new: int, eos_bias: float = 3.0) -> Path:
    """A MarianMTModel of `cfg` with weights far from their initialization (so that every one of them shows), and
    generate's settings nanomt's decoding matches (beam 4, no forced EOS, no early stop), saved in `out`. EOS's
    output bias is raised by `eos_bias`: translations of many lengths, not all cut at max_len."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "layer_norm.weight" in name else 0.0, 0.1 if "layer_norm" in name else 0.4)
        model.final_logits_bias.normal_(0.0, 1.0)
        model.final_logits_bias[0, 0] += eos_bias
    gen = model.generation_config
    gen.num_beams, gen.max_length, gen.bad_words_ids = 4, max_new + 1, [[cfg.pad_token_id]]
    gen.forced_eos_token_id, gen.early_stopping, gen.length_penalty = None, False, 1.0
    model.save_pretrained(out)
    return out
