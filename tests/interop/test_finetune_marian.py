"""Fine-tuning an imported Marian model in nanomt against a plain PyTorch loop over transformers' MarianMTModel:
the same batches, AdamW, constant lr, clipping; the same weights after 5 steps (offline, small random models)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config
from marian_models import opus_mt_tokenizer, small_config

from nanomt.core.checkpoint import WEIGHTS, load_checkpoint, read_weights
from nanomt.core.config import config_from_dict
from nanomt.core.model import Transformer
from nanomt.decoding.translate import Translator
from nanomt.interop import import_marian
from nanomt.interop.marian import load_marian_weights
from nanomt.training import train as train_module
from nanomt.training.synthetic import write_corpus
from nanomt.training.train import train

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

STEPS, LR, WEIGHT_DECAY, EPS = 5, 1e-3, 0.01, 1e-8
TOLERANCE = 1e-5  # the largest difference of a tensor, relative to its largest value


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("toy"), pairs=300, valid=4, test=4)


@pytest.fixture(scope="module")
def marian_dir(corpus, tmp_path_factory) -> Path:
    """A random opus-mt-like MarianMTModel (shared table, <pad> last and the decoder's start), without dropout."""
    out = tmp_path_factory.mktemp("marian")
    table = opus_mt_tokenizer(out, corpus)["vocab"]
    pad = table["<pad>"]
    no_dropout = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    cfg = small_config(len(table), pad, decoder_vocab_size=len(table), activation_function="swish", **no_dropout)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(cfg)
    with torch.no_grad():  # every weight away from its initial value (zero biases, unit norms), so that each shows
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # the sinusoid table
                continue
            p.normal_(1.0 if "layer_norm.weight" in name else 0.0, 0.05 if "layer_norm" in name else 0.2)
        model.final_logits_bias.normal_(0.0, 1.0)
    gen = model.generation_config  # opus-mt's decoding: beam 4, fairseq's stopping rule
    gen.num_beams, gen.max_length, gen.early_stopping, gen.bad_words_ids = 4, 16, True, [[pad]]
    model.save_pretrained(out)
    return out


def finetuned(imported: Path, corpus, out: Path, smoothing: float, monkeypatch) -> tuple[Path, list]:
    """`nanomt train` with train.init_from, as a user runs it; returns the run and the batches of its steps."""
    cfg = tiny_config(corpus, init_from=str(imported), max_steps=STEPS, max_tokens=300, lr=LR, warmup_steps=0)
    cfg["train"].update(
        schedule="constant", label_smoothing=smoothing, weight_decay=WEIGHT_DECAY, eps=EPS, clip_norm=1.0
    )
    cfg["train"]["betas"] = [0.9, 0.98]
    del cfg["model"], cfg["data"]["vocab_size"], cfg["data"]["shared_vocab"], cfg["data"]["valid"]
    steps = []
    real = train_module.next_group

    def recording(*args, **kwargs):
        group, ep = real(*args, **kwargs)
        steps.append([dict(src=b.src, tgt_in=b.tgt_in, tgt_out=b.tgt_out) for b in group.batches])
        return group, ep

    monkeypatch.setattr(train_module, "next_group", recording)
    return train(config_from_dict(cfg), out), steps


def reference(marian_dir: Path, steps: list, pad: int, smoothing: float):
    """transformers' model trained on the same batches by a plain loop: summed loss / target tokens, AdamW, clip."""
    model = transformers.MarianMTModel.from_pretrained(marian_dir).train()
    # from_pretrained leaves the sinusoid tables trainable, but save_pretrained never writes them (they are made
    # anew at every load): what transformers keeps of a fine-tuned model is the fixed table's, so it stays fixed.
    for side in (model.model.encoder, model.model.decoder):
        side.embed_positions.weight.requires_grad_(False)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LR, betas=(0.9, 0.98), eps=EPS, weight_decay=WEIGHT_DECAY, fused=True
    )
    for batches in steps:
        (b,) = batches
        labels = b["tgt_out"].masked_fill(b["tgt_out"] == pad, -100)
        logits = model(input_ids=b["src"], attention_mask=b["src"] != pad, decoder_input_ids=b["tgt_in"]).logits
        loss = (
            F.cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing=smoothing, reduction="sum")
            / (labels != -100).sum()
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fine_tuning_an_imported_marian_model_gives_transformers_weights(
    marian_dir, corpus, tmp_path, monkeypatch, smoothing
):
    """Within 1e-5 of each tensor's scale; the key biases apart, whose gradient is 0 but for rounding (see below)."""
    imported = import_marian(marian_dir, tmp_path / "imported")
    run, steps = finetuned(imported, corpus, tmp_path / "run", smoothing, monkeypatch)
    _, cfg, _ = load_checkpoint(imported)
    pad, start = cfg.model.pad_id, cfg.model.bos_id
    assert start == pad and len(steps) == STEPS
    assert all((b["tgt_in"][:, 0] == pad).all() for batches in steps for b in batches)  # Marian starts from pad
    hf = reference(marian_dir, steps, pad, smoothing)
    expected = Transformer(cfg.model)
    load_marian_weights(expected, {k.removeprefix("model."): v for k, v in hf.state_dict().items()})
    got, want, start_weights = read_weights(run / WEIGHTS), expected.state_dict(), read_weights(imported / WEIGHTS)
    worst, worst_name = 0.0, ""
    for name, tensor in got.items():
        ref = want[name][tuple(slice(0, n) for n in want[name].shape)]
        rows = tuple(slice(0, n) for n in tensor.shape)
        a, b = tensor, ref[rows] if ref.shape != tensor.shape else ref
        v = cfg.model.tgt_vocab_size
        if a.dim() >= 1 and a.size(0) > v and "embed" in name or name.startswith("output"):
            a, b = a[:v], b[:v]  # the rows model.vocab_multiple pads with are never scored
        keep = torch.ones(a.size(0), dtype=torch.bool)
        # A key bias adds the same score to every key of a query, so its gradient is 0 in exact arithmetic; in
        # floats it is rounding noise, which Adam scales to steps of up to lr in both toolkits alike.
        if name.endswith("qkv.bias") or name.endswith(".kv.bias"):
            d = cfg.model.d_model
            first = d if name.endswith("qkv.bias") else 0
            keep[first : first + d] = False
        diff = float((a[keep] - b[keep]).abs().max() / b[keep].abs().max())
        if diff > worst:
            worst, worst_name = diff, name
    moved = max(float((got[k] - start_weights[k]).abs().max()) for k in got)
    print(f"label smoothing {smoothing}: largest relative difference {worst:.2e} ({worst_name}); moved {moved:.2e}")
    assert moved > 2 * LR  # the 5 steps changed the weights: a comparison of untrained models proves nothing
    assert worst < TOLERANCE, f"{worst_name}: {worst:.2e}"


def test_export_ct2_of_a_fine_tuned_imported_model_decodes_as_nanomt(marian_dir, corpus, tmp_path, monkeypatch):
    """The fine-tuned opus-mt-like model, exported to CTranslate2: greedy and beam 4 give nanomt's tokens."""
    pytest.importorskip("ctranslate2")
    from nanomt.interop.ct2 import Ct2Translator, export_ct2

    run, _ = finetuned(import_marian(marian_dir, tmp_path / "imported"), corpus, tmp_path / "run", 0.1, monkeypatch)
    ours = Translator.from_checkpoint(run)
    theirs = Ct2Translator(export_ct2(run, tmp_path / "ct2"), intra_threads=1)
    sources = corpus["train.src"].read_text(encoding="utf-8").splitlines()[:40]
    src_ids = ours.tokenizer.encode_src(sources)
    for beam in (1, 4):
        expected = [h[0].tokens for h in ours.translate_hypotheses(sources, beam_size=beam)]
        assert theirs.translate_ids(src_ids, beam_size=beam) == expected, f"beam {beam}"
    assert len(set(map(tuple, expected))) > 10
