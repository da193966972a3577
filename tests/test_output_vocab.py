"""model.restrict_output: the output layer scores only the target ids of the training data."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import random_src, tiny_config

from nanomt.checkpoint import WEIGHTS, average_checkpoints, load_checkpoint, read_weights, step_dirs
from nanomt.config import ModelConfig, config_from_dict
from nanomt.data import binarize, output_ids
from nanomt.decode import beam_search, greedy
from nanomt.ensemble import Ensemble
from nanomt.model import Transformer, prune_output
from nanomt.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from nanomt.train import label_smoothed_loss, train
from nanomt.translate import Translator

V = 50


def tied_pair(seed: int = 0) -> tuple[Transformer, Transformer]:
    """The same random shared-vocabulary model twice: with restrict_output (all ids kept so far) and without."""
    kw = dict(d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0)
    kw.update(share_embeddings=True, tie_output=True, max_positions=64)
    torch.manual_seed(seed)
    full = Transformer(ModelConfig(V, V, **kw)).eval()
    with torch.no_grad():
        full.output.weight.mul_(8.0)  # peaky distributions: decoding choices are not near-ties
    restricted = Transformer(ModelConfig(V, V, restrict_output=True, **kw)).eval()
    missing, unexpected = restricted.load_state_dict(full.state_dict(), strict=False)
    assert missing == ["output_mask"] and not unexpected
    return restricted, full


KEPT = torch.tensor([EOS_ID, UNK_ID, 7, 9, 11, 20, 21, 22, 30, 41, 49])


def test_logits_are_the_full_models_at_kept_ids_and_minus_inf_elsewhere():
    restricted, full = tied_pair()
    restricted.set_output_vocab(KEPT)
    kept = sorted({PAD_ID, *KEPT.tolist()})  # padding is always kept, at its own position
    assert restricted.output_ids.tolist() == kept
    src, tgt = random_src([5, 3], vocab=V), random_src([4, 6], seed=1, vocab=V)
    ref = full(src, tgt)  # (B, T, V)
    assert torch.allclose(restricted(src, tgt, restricted=True), ref[..., kept], atol=1e-5)
    out = restricted(src, tgt)
    dropped = [i for i in range(V) if i not in kept]
    assert torch.allclose(out[..., kept], ref[..., kept], atol=1e-5)
    assert torch.isneginf(out[..., dropped]).all()


def test_restricted_loss_is_cross_entropy_over_the_kept_ids_with_unscored_targets_skipped():
    restricted, full = tied_pair()
    restricted.set_output_vocab(KEPT)
    kept = restricted.output_ids.tolist()
    position = {t: i for i, t in enumerate(kept)}  # built by hand, not from output_index
    src = random_src([5, 3], vocab=V)
    tgt = torch.tensor([[7, 9, 11, EOS_ID], [20, 33, EOS_ID, PAD_ID]])  # 33 is not kept
    logits = restricted(src, tgt, restricted=True)
    got = label_smoothed_loss(logits, restricted.output_targets(tgt), 0.1, PAD_ID)
    ref_logits = full(src, tgt)[..., kept]
    # Row 0 whole; row 1 without the unscored 33 (position 1) and the padding (position 3).
    rows = torch.cat([ref_logits[0], ref_logits[1, [0, 2]]])
    target = torch.tensor([position[t] for t in (7, 9, 11, EOS_ID, 20, EOS_ID)])
    ref = F.cross_entropy(rows, target, label_smoothing=0.1, reduction="sum")
    assert math.isclose(got.item(), ref.item(), rel_tol=1e-5)


class MaskedOutput(torch.nn.Module):
    """Reference: the full model's output layer with -inf at the dropped ids, built without restrict_output."""

    def __init__(self, linear: torch.nn.Linear, keep: torch.Tensor):
        super().__init__()
        self.linear = linear
        self.dropped = torch.ones(linear.out_features, dtype=torch.bool)
        self.dropped[keep] = False

    def forward(self, h):
        return self.linear(h).masked_fill(self.dropped, float("-inf"))


def test_decoding_equals_the_full_model_with_dropped_ids_masked():
    restricted, full = tied_pair(seed=3)
    src = random_src([6, 4, 7], seed=2, vocab=V)
    free = greedy(full, src, max_len=12)
    # Drop the tokens the unrestricted model chose, so that the restricted model has to choose others.
    chosen = {t for row in free for t in row}
    keep = torch.tensor([i for i in range(V) if i not in chosen])
    restricted.set_output_vocab(keep)
    full.output = MaskedOutput(full.output, restricted.output_ids)
    got = greedy(restricted, src, max_len=12)
    assert got == greedy(full, src, max_len=12) and got != free
    assert all(t not in chosen for row in got for t in row)
    beams = [[h.tokens for h in hyps] for hyps in beam_search(restricted, src, 3, max_len=12, n_best=3)]
    assert beams == [[h.tokens for h in hyps] for hyps in beam_search(full, src, 3, max_len=12, n_best=3)]


def test_pruned_copy_projects_onto_the_kept_rows_only_and_scores_as_the_model_does():
    restricted, _ = tied_pair(seed=4)
    restricted.set_output_vocab(KEPT)
    before = {k: v.clone() for k, v in restricted.state_dict().items()}
    pruned = prune_output(restricted)
    k = len(restricted.output_ids)
    assert pruned.output.weight.shape == (k, 32) and restricted.output.weight.shape == (V, 32)
    assert restricted.output.weight is restricted.tgt_embed.tokens.weight  # the original stays tied, unchanged
    assert all(torch.equal(before[n], t) for n, t in restricted.state_dict().items())
    assert torch.equal(pruned.output.weight, restricted.tgt_embed.tokens.weight[restricted.output_ids])
    src, tgt = random_src([5, 3], seed=5, vocab=V), random_src([4, 6], seed=6, vocab=V)
    with torch.inference_mode():
        ref, out = restricted(src, tgt), pruned(src, tgt)  # (B, T, V) both
        assert torch.allclose(pruned(src, tgt, restricted=True), restricted(src, tgt, restricted=True), atol=1e-5)
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)) and torch.isneginf(ref).any()
    kept = restricted.output_ids
    assert torch.allclose(out[..., kept], ref[..., kept], atol=1e-5)
    unrestricted = Transformer(dataclasses.replace(restricted.cfg, restrict_output=False))
    assert prune_output(unrestricted) is unrestricted


def test_translator_decodes_restricted_models_through_the_pruned_projection(toy_corpus, tmp_path):
    restricted, full = tied_pair(seed=3)
    src = random_src([6, 4, 7], seed=2, vocab=V)
    chosen = {t for row in greedy(full, src, max_len=12) for t in row}
    restricted.set_output_vocab(torch.tensor([i for i in range(V) if i not in chosen]))
    tok = None  # Translator's model and decoding do not need the tokenizer here
    cfg = config_from_dict(tiny_config(toy_corpus))
    float32 = Translator(restricted, tok, cfg).model
    assert float32.output.out_features == len(restricted.output_ids) < V
    assert restricted.output.out_features == V  # the model given is not changed
    with torch.inference_mode():
        assert greedy(float32, src, max_len=12) == greedy(restricted, src, max_len=12)
        ref = [[h.tokens for h in hyps] for hyps in beam_search(restricted, src, 3, max_len=12, n_best=3)]
        assert [[h.tokens for h in hyps] for hyps in beam_search(float32, src, 3, max_len=12, n_best=3)] == ref
        int8 = Translator(restricted, tok, cfg, int8=True).model
        assert int8.output.out_features == len(restricted.output_ids)  # quantized after pruning: K rows
        tgt = random_src([4, 6], seed=1, vocab=V)
        out, want = int8(src[:2], tgt), restricted(src[:2], tgt)
        ensemble = Translator(Ensemble([restricted, full]), tok, cfg).model
    assert torch.equal(torch.isneginf(out), torch.isneginf(want))
    kept = restricted.output_ids
    assert (out[..., kept] - want[..., kept]).norm() / want[..., kept].norm() < 0.06  # int8's error, as elsewhere
    assert ensemble.members[0].output.out_features < V and ensemble.members[1] is full


@pytest.fixture(scope="module")
def restricted_run(toy_corpus, tmp_path_factory):
    cfg = tiny_config(toy_corpus, max_steps=20, eval_every=10, save_every=10, keep_last=5)
    cfg["data"]["shared_vocab"] = True
    cfg["model"].update(share_embeddings=True, tie_output=True, restrict_output=True)
    return train(config_from_dict(cfg), tmp_path_factory.mktemp("restricted") / "run")


def test_a_run_keeps_the_training_targets_ids_in_every_checkpoint(restricted_run):
    run = restricted_run
    tok = Tokenizer.load(run / "tokenizer")
    model, cfg, _ = load_checkpoint(run)
    corpus = binarize(cfg.data, "train", tok, run / "bin", max_len=cfg.model.max_positions - 1)
    expected = sorted({PAD_ID, *output_ids(corpus).tolist()})
    assert model.output_ids.tolist() == expected and len(expected) < tok.tgt_vocab_size  # the shared vocab's
    assert EOS_ID in expected and BOS_ID not in expected
    for _, step_dir in step_dirs(run):
        assert torch.equal(read_weights(step_dir / WEIGHTS)["output_mask"], model.output_mask)
    avg, _, _ = load_checkpoint(average_checkpoints([d for _, d in step_dirs(run)], run.parent / "avg"))
    assert avg.output_ids.tolist() == expected


def test_set_output_vocab_needs_a_restricted_model():
    _, full = tied_pair()
    with pytest.raises(ValueError, match="restrict_output"):
        full.set_output_vocab(KEPT)
