"""`nanomt export ct2|onnx`: CTranslate2's and ONNX Runtime's outputs are nanomt's, on trained toy checkpoints."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_src, random_transformer, tiny_config, tokens

from nanomt.core.config import config_from_dict
from nanomt.core.decoding import Decoding
from nanomt.core.model import Transformer
from nanomt.decoding.greedy import greedy as nanomt_greedy
from nanomt.decoding.translate import Translator
from nanomt.training.train import train

pytestmark = pytest.mark.slow  # foreign converters and runtimes: CTranslate2, ONNX Runtime

# Each checkpoint covers a different corner of what the exporters map.
VARIANTS = {
    # Separate vocabularies and embeddings, pre-norm, relu, GNMT's length penalty (the defaults).
    "pre_norm": ({}, {}, {}),
    # One vocabulary, shared and tied embeddings, post-norm, an output restricted to the training targets; the
    # 120 ids' matrices padded to 128 rows.
    "tied_post_norm": (
        {"shared_vocab": True},
        {
            "share_embeddings": True,
            "tie_output": True,
            "norm_first": False,
            "restrict_output": True,
            "vocab_multiple": 16,
        },
        {"length_penalty_kind": "average", "min_len": 1},
    ),
    # Marian's options: sines before cosines, an output bias; gelu, no length penalty; padded matrices.
    "halves_bias": (
        {},
        {"sinusoidal_layout": "halves", "output_bias": True, "activation": "gelu", "vocab_multiple": 16},
        {"length_penalty_kind": "none"},
    ),
}


@pytest.fixture(scope="module")
def runs(toy_corpus, trained, one_thread) -> dict[str, Path]:
    """The variants trained a few dozen steps each: enough that their outputs are not all the same sentence."""
    return {name: trained(variant_config(toy_corpus, *variant)) for name, variant in VARIANTS.items()}


def variant_config(toy_corpus, data: dict, model: dict, decode: dict) -> dict:
    """The tiny config of a variant (test_onnx_batches.py's too: conftest's `trained` trains each once)."""
    cfg = tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60, lr=1e-2, max_tokens=1000)
    cfg["data"].update(data)
    cfg["model"].update(model)
    cfg["decode"].update(decode)
    return cfg


@pytest.fixture(scope="module")
def sources(toy_corpus) -> list[str]:
    return toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()


def with_decode(translator: Translator, **decode) -> Translator:
    """The translator with other decoding settings."""
    translator.cfg = dataclasses.replace(translator.cfg, decode=dataclasses.replace(translator.cfg.decode, **decode))
    return translator


# ---------------------------------------------------------------------------------------------------------
# CTranslate2.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ct2_translations_are_nanomt_s(variant, runs, sources, tmp_path):
    """Greedy and beam 2 and 4, with the checkpoint's length penalty, max_len and min_len: the same tokens."""
    pytest.importorskip("ctranslate2")
    from nanomt.interop.ct2 import Ct2Translator, export_ct2

    out = export_ct2(runs[variant], tmp_path / "ct2")
    ours, theirs = Translator.from_checkpoint(runs[variant]), Ct2Translator(out, intra_threads=1)
    src_ids = ours.tokenizer.encode_src(sources)
    for beam in (1, 2, 4):
        expected = [h[0].tokens for h in ours.translate_hypotheses(sources, beam_size=beam)]
        assert theirs.translate_ids(src_ids, beam_size=beam) == expected, f"beam {beam}"
    assert len(set(map(tuple, expected))) > 20  # a model that says one sentence to everything would prove little
    assert theirs.translate(sources[:10], beam_size=2) == ours.translate(sources[:10], beam_size=2)


def test_ct2_length_penalty_kinds(runs, sources, tmp_path):
    """Each length penalty kind and alpha on one checkpoint, rescored as nanomt scores its hypotheses."""
    pytest.importorskip("ctranslate2")
    from nanomt.interop.ct2 import Ct2Translator, export_ct2

    out = export_ct2(runs["pre_norm"], tmp_path / "ct2")
    ours, theirs = Translator.from_checkpoint(runs["pre_norm"]), Ct2Translator(out, intra_threads=1)
    src_ids = ours.tokenizer.encode_src(sources)
    for kind, alpha in (("gnmt", 0.6), ("average", 1.0), ("none", 1.0)):
        theirs.decode.update(length_penalty_kind=kind)
        expected = [
            h[0].tokens
            for h in with_decode(ours, length_penalty_kind=kind).translate_hypotheses(
                sources, beam_size=3, length_penalty=alpha
            )
        ]
        assert theirs.translate_ids(src_ids, beam_size=3, length_penalty=alpha) == expected, kind


def test_ct2_refuses_what_it_cannot_express(toy_corpus, runs, tmp_path):
    """No encoder layer (CTranslate2 cannot load one); Hugging Face's stopping rule with a length penalty."""
    pytest.importorskip("ctranslate2")
    from nanomt.interop.ct2 import Ct2ExportError, Ct2Translator, export_ct2

    cfg = tiny_config(toy_corpus, max_steps=2, eval_every=2, save_every=2)
    cfg["model"]["n_encoder_layers"] = 0
    train(config_from_dict(cfg), tmp_path / "run")
    with pytest.raises(Ct2ExportError, match="at least one encoder layer"):
        export_ct2(tmp_path / "run", tmp_path / "ct2_none")
    assert not (tmp_path / "ct2_none").exists()
    theirs = Ct2Translator(export_ct2(runs["pre_norm"], tmp_path / "ct2"))
    theirs.decode.update(early_stopping=False)
    with pytest.raises(Ct2ExportError, match="early_stopping"):
        theirs.translate_ids([[5, 6, 7]], beam_size=2)


# ---------------------------------------------------------------------------------------------------------
# ONNX.
# ---------------------------------------------------------------------------------------------------------


def padded(rows: list[list[int]], pad_id: int) -> np.ndarray:
    """Right-padded (B, S) int64."""
    out = np.full((len(rows), max(map(len, rows))), pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_onnx_logits_and_greedy_are_nanomt_s(variant, runs, sources, tmp_path):
    """Step by step along nanomt's greedy outputs the logits agree within 1e-4; the ONNX greedy loop is nanomt's."""
    pytest.importorskip("onnxruntime")
    from nanomt.interop.onnx import empty_cache, export_onnx, greedy, sessions

    encoder, decoder_step = sessions(export_onnx(runs[variant], tmp_path / "onnx"))
    ours = Translator.from_checkpoint(runs[variant])
    model, m = ours.model, ours.cfg.model
    src_ids = [s + [m.eos_id] for s in ours.tokenizer.encode_src(sources)]
    src = padded(src_ids, m.pad_id)
    d = ours.default_decoding  # its budget and min_len, at beam 1
    greedy_1 = Decoding(beam_size=1, max_len_a=d.max_len_a, max_len_b=d.max_len_b, min_len=d.min_len)
    expected = tokens(nanomt_greedy(model, torch.from_numpy(src), greedy_1))
    max_lens = [ours._max_len(len(s) - 1) for s in src_ids]
    assert greedy(encoder, decoder_step, src, m, max_lens, ours.cfg.decode.min_len) == expected

    # Teacher-forced: BOS + nanomt's greedy tokens, one step at a time through the cache, against model(src, tgt).
    tgt = torch.from_numpy(padded([([m.bos_id] + t)[: m.max_positions] for t in expected], m.pad_id))
    with torch.no_grad():
        reference = model(torch.from_numpy(src), tgt).numpy()  # (B, T, V)
    (memory,) = encoder.run(None, {"src": src})
    with torch.no_grad():
        np.testing.assert_allclose(memory, model.encode(torch.from_numpy(src)).memory.numpy(), atol=1e-4)
    keys = values = empty_cache(m, len(src))
    largest = 0.0
    for t in range(tgt.size(1)):
        feeds = {"tokens": tgt[:, t : t + 1].numpy(), "memory": memory, "src_mask": src != m.pad_id}
        logits, keys, values = decoder_step.run(None, {**feeds, "past_keys": keys, "past_values": values})
        scored = np.isfinite(reference[:, t])  # restrict_output: -inf on the ids the model does not score
        assert (np.isfinite(logits) == scored).all()
        largest = max(largest, float(np.abs(logits[scored] - reference[:, t][scored]).max()))
    assert largest < 1e-4


# Random models (no training: the graphs' numbers, not the translations, are compared) for each option the traced
# code branches on; the second scores 31 of its 40 ids (-inf logits elsewhere).
GRAPH_VARIANTS = {
    "pre_norm": {},
    "learned_post_norm_restricted": {"positional": "learned", "norm_first": False, "restrict_output": True},
    "halves_tied_bias": {
        "sinusoidal_layout": "halves",
        "share_embeddings": True,
        "tie_output": True,
        "output_bias": True,
        "activation": "gelu",
        "vocab_multiple": 16,
    },
}


def random_model(**overrides) -> Transformer:
    """conftest's random model with other options, in eval mode."""
    cfg = dataclasses.replace(random_transformer(0, 40).cfg, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Transformer(cfg).eval()
    with torch.no_grad():
        if cfg.output_bias:
            model.output.bias.normal_(0.0, 0.5)
        if cfg.restrict_output:
            model.set_output_vocab(torch.arange(4, 34))
    return model


@pytest.mark.parametrize("variant", list(GRAPH_VARIANTS))
def test_onnx_graphs_are_the_models_encode_and_decode_steps(variant, tmp_path, one_thread):
    """The traced graphs against the model's own encode and cached decode (a cache that grows, as decoding's does):
    memory, each step's logits (-inf exactly where the model's) and the keys/values it returns are the model's
    cache, within 1e-5, on a batch and lengths other than the traced ones, an all-padding source included."""
    pytest.importorskip("onnxruntime")
    from nanomt.interop.onnx import empty_cache, export_graphs, sessions

    model = random_model(**GRAPH_VARIANTS[variant])
    m = model.cfg
    export_graphs(model, tmp_path)
    encoder, decoder_step = sessions(tmp_path)
    src = torch.cat([random_src([5, 9, 1, 7], seed=1, extra_pad=2, vocab=40), torch.full((1, 12), m.pad_id)])
    tgt = torch.randint(4, 40, (len(src), 11), generator=torch.Generator().manual_seed(2))
    tgt[:, 0], tgt[1, 6:] = m.bos_id, m.pad_id
    with torch.no_grad():
        enc = model.encode(src)
        (memory,) = encoder.run(None, {"src": src.numpy()})
        np.testing.assert_allclose(memory, enc.memory.numpy(), atol=1e-5, rtol=0)
        # The model's mask, all-padding fix-up included, so that every row is compared.
        feeds = {"memory": enc.memory.numpy(), "src_mask": enc.src_mask[:, 0, 0].numpy()}
        keys = values = empty_cache(m, len(src))
        cache = model.init_cache(enc)
        for t in range(tgt.size(1)):
            logits, keys, values = decoder_step.run(
                None, {**feeds, "tokens": tgt[:, t : t + 1].numpy(), "past_keys": keys, "past_values": values}
            )
            out = model.decode(tgt[:, t : t + 1], enc, cache)
            cache, expected = out.cache, out.logits[:, -1].numpy()
            scored = np.isfinite(expected)
            assert (np.isfinite(logits) == scored).all(), f"step {t}: -inf on other ids"
            assert (~scored).any() == m.restrict_output
            np.testing.assert_allclose(logits[scored], expected[scored], atol=1e-5, rtol=0, err_msg=f"step {t}")
            for ours, name in ((keys, "self_k"), (values, "self_v")):
                # (L, B, H, t+1, K): the filled positions of the model's buffers
                theirs = torch.stack([getattr(c, name)[:, :, : t + 1] for c in cache.layers]).numpy()
                assert ours.shape == theirs.shape
                np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0, err_msg=f"step {t}: {name}")


def test_onnx_decoder_step_module_is_the_models_decode(one_thread):
    """Before tracing, the decoder step module is model.decode itself: the same numbers, to the bit, step by step."""
    from nanomt.interop.onnx import DecoderStepGraph, EncoderGraph, empty_cache

    model = random_model(**GRAPH_VARIANTS["learned_post_norm_restricted"])
    m = model.cfg
    src = random_src([6, 2, 4], seed=3, vocab=40)
    tgt = torch.randint(4, 40, (3, 6), generator=torch.Generator().manual_seed(4))
    tgt[:, 0] = m.bos_id
    step = DecoderStepGraph(model)
    with torch.no_grad():
        enc = model.encode(src)
        assert torch.equal(EncoderGraph(model)(src), enc.memory)
        keys = values = torch.from_numpy(empty_cache(m, len(src)))
        cache = model.init_cache(enc)
        for t in range(tgt.size(1)):
            logits, keys, values = step(tgt[:, t : t + 1], enc.memory, enc.src_mask[:, 0, 0], keys, values)
            out = model.decode(tgt[:, t : t + 1], enc, cache)
            cache = out.cache
            assert torch.equal(logits, out.logits[:, -1])
            assert torch.equal(keys, torch.stack([c.self_k[:, :, : t + 1] for c in cache.layers]))
            assert torch.equal(values, torch.stack([c.self_v[:, :, : t + 1] for c in cache.layers]))


def test_onnx_export_needs_an_eval_mode_model_with_a_decoder(tmp_path):
    """A model in train mode (its dropout would be traced) or without decoder layers is refused, nothing written."""
    from nanomt.interop.onnx import export_graphs

    with pytest.raises(ValueError, match="eval mode"):
        export_graphs(random_model().train(), tmp_path / "train")
    with pytest.raises(ValueError, match="decoder layer"):
        export_graphs(random_model(n_decoder_layers=0), tmp_path / "none")
    assert not (tmp_path / "train").exists() and not (tmp_path / "none").exists()


def test_export_commands_write_what_the_functions_write(runs, tmp_path, capsys):
    """`nanomt export ct2|onnx RUN --out DIR` write the same files as export_ct2 / export_onnx."""
    from nanomt.cli import main

    run = runs[next(iter(VARIANTS))]
    for target, module in (("ct2", "ctranslate2"), ("onnx", "onnxruntime")):
        pytest.importorskip(module)
        main(["export", target, str(run), "--out", str(tmp_path / target)])
        assert capsys.readouterr().out.strip() == f"exported to {tmp_path / target}"
        assert {p.name for p in (tmp_path / target).iterdir()} >= {"tokenizer", "nanomt.yaml"}
    assert (tmp_path / "ct2" / "model.bin").is_file()
    assert {"encoder.onnx", "decoder_step.onnx"} <= {p.name for p in (tmp_path / "onnx").iterdir()}


@pytest.mark.parametrize("beam", [1, 3])
def test_ct2_honours_prefixes_and_repetition_guards(runs, sources, tmp_path, beam):
    """target_prefix, and (greedy) no_repeat_ngram_size and repetition_penalty, passed to CTranslate2: nanomt's tokens.
    In beam search CTranslate2 applies the guards before normalizing, nanomt as transformers after: not compared."""
    pytest.importorskip("ctranslate2")
    from nanomt.interop.ct2 import Ct2ExportError, Ct2Translator, export_ct2

    theirs = Ct2Translator(export_ct2(runs["pre_norm"], tmp_path / "ct2"), intra_threads=1)
    ours = Translator.from_checkpoint(runs["pre_norm"])
    src_ids = ours.tokenizer.encode_src(sources)
    prefix_text = [" ".join(t.split()[:1]) for t in ours.translate(sources, beam_size=1)]
    prefix_ids = ours.tokenizer.encode_tgt(prefix_text)
    expected = [h[0].tokens for h in ours.translate_hypotheses(sources, beam_size=beam, prefixes=prefix_text)]
    assert theirs.translate_ids(src_ids, beam_size=beam, prefixes=prefix_ids) == expected
    for guard in ({"no_repeat_ngram_size": 2}, {"repetition_penalty": 1.8}) if beam == 1 else ():
        theirs.decode.update(guard)
        guarded = with_decode(Translator.from_checkpoint(runs["pre_norm"]), **guard)
        expected = [h[0].tokens for h in guarded.translate_hypotheses(sources, beam_size=1)]
        assert expected != [h[0].tokens for h in ours.translate_hypotheses(sources, beam_size=1)]  # it bites
        assert theirs.translate_ids(src_ids, beam_size=1) == expected, guard
        theirs.decode.update(no_repeat_ngram_size=0, repetition_penalty=1.0)
    theirs.decode["glossary"] = [["a", "b"]]
    with pytest.raises(Ct2ExportError, match="constrained search"):
        theirs.translate_ids(src_ids[:1], beam_size=beam)
