"""The options an imported Marian model needs, each on its own: position layout, logits bias, special ids,
Hugging Face's stopping rule, and a tokenizer whose ids come from a table."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import numpy as np
import pytest
import sentencepiece as spm
import torch
from conftest import decoding, tokens
from marian_models import id_table
from search_models import EOS, STOP_TABLE, A, B, C, TableModel, table_src

from nanomt.core.config import BOS_ID, ModelConfig
from nanomt.core.model import Transformer, sinusoidal_table
from nanomt.core.tokenizer import TGT_VOCAB_FILE, VOCAB_FILE, Tokenizer
from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy
from nanomt.training.synthetic import generate_pairs

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(**options) -> ModelConfig:
    return ModelConfig(
        src_vocab_size=20,
        tgt_vocab_size=20,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        dropout=0.0,
        max_positions=32,
        **options,
    )


def marian_table(n_positions: int, dim: int) -> np.ndarray:
    """Hugging Face's MarianSinusoidalPositionalEmbedding.create_weight, written out."""
    angle = np.array([[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for pos in range(n_positions)])
    return np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1)


def test_halves_layout_is_marians_table_and_the_models():
    table = sinusoidal_table(40, 16, "halves")
    np.testing.assert_allclose(table.numpy(), marian_table(40, 16), atol=1e-6)
    # The same frequencies as the paper's table, in another order along D.
    assert torch.equal(table, sinusoidal_table(40, 16)[:, list(range(0, 16, 2)) + list(range(1, 16, 2))])
    model = Transformer(tiny_config(sinusoidal_layout="halves"))
    assert torch.equal(model.src_embed.table, sinusoidal_table(32, 16, "halves"))
    assert torch.equal(model.tgt_embed.table, sinusoidal_table(32, 16, "halves"))


def test_output_bias_is_added_to_the_logits():
    torch.manual_seed(0)
    plain = Transformer(tiny_config()).eval()
    biased = Transformer(tiny_config(output_bias=True)).eval()
    assert "output.bias" not in plain.state_dict()
    biased.load_state_dict({**plain.state_dict(), "output.bias": torch.zeros(20)})
    bias = torch.randn(20)
    with torch.no_grad():
        biased.output.bias.copy_(bias)
    src, tgt = torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 8, 9]])
    torch.testing.assert_close(biased(src, tgt), plain(src, tgt) + bias, rtol=0, atol=1e-5)


def test_decoding_starts_from_bos_id_and_ends_at_eos_id():
    torch.manual_seed(1)
    model = Transformer(tiny_config(bos_id=5, eos_id=7)).eval()
    src = torch.tensor([[9, 10, 11, 7], [12, 7, 0, 0]])

    def reference(bos: int) -> list[list[int]]:
        """Uncached greedy decoding from `bos`, stopping at 7, never producing pad or bos."""
        out = []
        for row in src:
            tokens = [bos]
            while len(tokens) <= 6:
                logits = model(row[None], torch.tensor([tokens]))[0, -1]
                logits[[0, bos]] = -math.inf
                tokens.append(int(logits.argmax()))
                if tokens[-1] == 7:
                    break
            out.append([t for t in tokens[1:] if t != 7])
        return out

    assert reference(5) != reference(BOS_ID)  # the start token matters to this model
    assert tokens(greedy(model, src, decoding(6))) == reference(5)
    with torch.no_grad():
        model.output.weight[7] = 100 * model.output.weight[7] + 1  # 7 wins at some steps
    hyps = tokens(greedy(model, src, decoding(6)))
    assert hyps == reference(5)
    assert all(7 not in h and len(h) < 6 for h in hyps)
    assert all(7 not in h.tokens for hyps in beam_search(model, src, decoding(6, 3, n_best=3)) for h in hyps)


def test_special_ids_are_checked():
    with pytest.raises(ValueError, match="bos_id"):
        tiny_config(bos_id=20)
    with pytest.raises(ValueError, match="eos_id"):
        tiny_config(eos_id=0)  # the pad id
    with pytest.raises(ValueError, match="sinusoidal_layout"):
        tiny_config(sinusoidal_layout="halves", positional="learned")
    with pytest.raises(ValueError, match="output_bias"):
        tiny_config(output_bias=True, restrict_output=True)


def test_early_stopping_false_goes_on_while_a_live_beam_scores_better():
    # STOP_TABLE, k=2, log p / len: step 1 finishes [] (-0.69); step 2 finishes [B] (-0.86) with A C live at
    # log 0.27 / 2 = -0.65 > -0.86, so Hugging Face's rule goes on and step 3 finishes A C at log 0.27 / 3 = -0.44.
    stub = TableModel(STOP_TABLE)
    src = table_src([2])
    search = dict(length_penalty=1.0, length_penalty_kind="average", n_best=2)
    hyps = beam_search(stub, src, decoding(4, 2, early_stopping=False, **search))[0]
    assert [h.tokens for h in hyps] == [[A, C], []]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.27) / 3, math.log(0.5)])
    assert [h.tokens for h in beam_search(stub, src, decoding(4, 2, **search))[0]] == [[], [B]]
    assert EOS not in hyps[0].tokens


# ---------------------------------------------------------------------------------------------------------
# A tokenizer whose ids come from a table over two SentencePiece models (Marian's vocab.json).
# ---------------------------------------------------------------------------------------------------------


def sentencepiece_model(sentences: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        minloglevel=2,
        # nanomt's own special ids, so that the models also make a tokenizer without a table
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
    )
    return model.getvalue()


@pytest.fixture(scope="module")
def models() -> tuple[bytes, bytes]:
    pairs = generate_pairs(300)
    return sentencepiece_model([s for s, _ in pairs], 40), sentencepiece_model([t for _, t in pairs], 44)


def test_id_table_gives_ids_pieces_and_text(models, tmp_path):
    table = id_table(*models, pad_last=True)
    tok = Tokenizer(*models, table)
    src_sp = spm.SentencePieceProcessor(model_proto=models[0])
    text = "la zira dormat"
    assert tok.encode_src([text]) == [[table.get(p, 1) for p in src_sp.encode(text, out_type=str)]]
    assert tok.encode_src([text]) != [src_sp.encode(text)]
    assert tok.encode_src(["Ω"])[0][-1] == 1  # a piece the table lacks is <unk>
    assert tok.encode_src([">>fra<< un talo"])[0][0] == 1  # a language tag is one piece (here unknown)
    assert (tok.pad_id, tok.unk_id, tok.eos_id) == (len(table) - 1, 1, 0)
    assert tok.src_vocab_size == tok.tgt_vocab_size == len(table)
    ids = tok.encode_tgt(["tha yent slomet"])[0]
    assert tok.tgt_pieces(ids) == spm.SentencePieceProcessor(model_proto=models[1]).encode(
        "tha yent slomet", out_type=str
    )
    assert tok.decode_tgt([[*ids, tok.eos_id, tok.pad_id]]) == ["tha yent slomet"]
    tok.save(tmp_path)
    assert json.loads((tmp_path / VOCAB_FILE).read_text()) == table
    again = Tokenizer.load(tmp_path)
    assert again.encode_tgt(["tha morp"]) == tok.encode_tgt(["tha morp"])
    assert again.fingerprint() == tok.fingerprint() != Tokenizer(*models).fingerprint()
    Tokenizer(*models).save(tmp_path)  # without a table, the stale one goes
    assert not (tmp_path / VOCAB_FILE).exists()


def test_separate_target_table(models, tmp_path):
    # Both tables must give </s> and <pad> the same ids: the model has one of each.
    src_table, tgt_table = id_table(models[0], pad_last=False), id_table(models[1], pad_last=False)
    tok = Tokenizer(*models, src_table, tgt_table)
    assert (tok.src_vocab_size, tok.tgt_vocab_size) == (len(src_table), len(tgt_table))
    tgt_sp = spm.SentencePieceProcessor(model_proto=models[1])
    assert tok.encode_tgt(["ek dask"]) == [[tgt_table.get(p, 1) for p in tgt_sp.encode("ek dask", out_type=str)]]
    tok.save(tmp_path)
    assert json.loads((tmp_path / TGT_VOCAB_FILE).read_text()) == tgt_table
    assert Tokenizer.load(tmp_path).encode_tgt(["ek dask"]) == tok.encode_tgt(["ek dask"])


def test_id_table_needs_its_special_pieces(models):
    table = id_table(*models, pad_last=True)
    del table["</s>"]
    with pytest.raises(ValueError, match="</s>"):
        Tokenizer(*models, dict(zip(table, range(len(table)))))


def test_model_config_round_trips_the_options():
    cfg = tiny_config(sinusoidal_layout="halves", output_bias=True, bos_id=19, eos_id=0, pad_id=19)
    assert dataclasses.replace(cfg) == cfg
