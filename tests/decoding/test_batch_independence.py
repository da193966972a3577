"""In float32 a sentence decodes alone as it does in any batch: ensembles, pruned models, length limits, beams 1-5,
and the Translator over several batches of different sizes (order restored; sampling seeded seed + k in batch k).
"""

import pytest
import torch
from conftest import decoding, max_len_fn, random_transformer, tokens
from decode_golden import LENGTHS, models

from nanomt.core.config import Config, DataConfig, DecodeConfig
from nanomt.core.tokenizer import train_tokenizer
from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy
from nanomt.decoding.sample import sample
from nanomt.decoding.translate import Translator

SETTINGS = {"plain": {}, "min_len2": {"min_len": 2}, "max_len_fn": {"max_len": max_len_fn(1.2, 3)}}

pytestmark = pytest.mark.usefixtures("one_thread")


def model_and_src(name: str) -> tuple:
    """decode_golden's fixed models (a Transformer, an ensemble of two widths and depths, a pruned copy) and sources."""
    m = models()
    return m[name], m["pruned_src" if name == "pruned" else "src"]


def decode_all(model, src: torch.Tensor, k: int, max_len, min_len: int) -> list[list[tuple[list[int], float]]]:
    """Each sentence's (tokens, score) hypotheses: greedy's one at k = 1, else beam search's k best."""
    if k == 1:
        return [[(out, 0.0)] for out in tokens(greedy(model, src, decoding(max_len, min_len=min_len)))]
    hyps = beam_search(model, src, decoding(max_len, k, min_len=min_len, n_best=k))
    return [[(h.tokens, h.score) for h in hs] for hs in hyps]


@pytest.mark.parametrize("setting", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("name", ["plain", "ensemble", "pruned"])
def test_each_sentence_decodes_alone_as_in_the_batch(name, k, setting):
    model, src = model_and_src(name)
    max_len, min_len = setting.get("max_len", 10), setting.get("min_len", 0)
    batch = decode_all(model, src, k, max_len, min_len)
    assert len({tuple(hyps[0][0]) for hyps in batch}) >= 4  # varied outputs: a mix-up of rows would show
    for i, n in enumerate(LENGTHS):
        alone = decode_all(model, src[i : i + 1, : n + 1], k, max_len, min_len)[0]
        assert [t for t, _ in batch[i]] == [t for t, _ in alone], f"sentence {i}"
        assert [s for _, s in batch[i]] == pytest.approx([s for _, s in alone], abs=1e-5), f"sentence {i}"


# ---------------------------------------------------------------------------------------------------------
# The Translator over several batches.
# ---------------------------------------------------------------------------------------------------------

MAX_TOKENS = 60  # a few sentences a batch, so that 30 lines make batches of different sizes
DECODE = DecodeConfig(max_len_a=1.0, max_len_b=4, min_len=1)


class BatchRecorder:
    """A model as it is, recording the source batch of every encode (one a decoding batch)."""

    def __init__(self, model):
        self.model, self.batches = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def encode(self, src, *args, **kwargs):
        self.batches.append(src.clone())
        return self.model.encode(src, *args, **kwargs)


@pytest.fixture(scope="module")
def translator(toy_corpus, tmp_path_factory) -> Translator:
    """A random model with the toy pair's tokenizer: varied outputs, some ending early."""
    data = DataConfig(vocab_size=120, shared_vocab=True)
    lines = [toy_corpus[f"train.{side}"].read_text(encoding="utf-8").splitlines() for side in ("src", "tgt")]
    tokenizer = train_tokenizer(*lines, tmp_path_factory.mktemp("tokenizer"), data)
    model = random_transformer(4, tokenizer.src_vocab_size)
    return Translator(model, tokenizer, Config(model=model.cfg, data=data, decode=DECODE))


@pytest.fixture(scope="module")
def lines(toy_corpus) -> list[str]:
    """30 distinct test lines in file order (not sorted by length), an empty one among them."""
    lines = list(dict.fromkeys(toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()))[:29]
    return [*lines[:5], "", *lines[5:]]


def recorded(translator: Translator) -> BatchRecorder:
    translator.model = BatchRecorder(translator.model)
    return translator.model


@pytest.mark.parametrize("beam_size", [1, 4])
def test_translator_over_several_batches_equals_one_sentence_at_a_time(translator, lines, beam_size):
    model = translator.model
    try:
        recorder = recorded(translator)
        got = translator.translate_hypotheses(lines, beam_size=beam_size, max_tokens=MAX_TOKENS)
        sizes = [b.size(0) for b in recorder.batches]
        assert len(sizes) >= 3 and len(set(sizes)) >= 2, sizes
        assert sum(sizes) == len(lines) - 1  # the empty line is never decoded
    finally:
        translator.model = model
    assert got[5][0].tokens == []
    assert len({tuple(h[0].tokens) for h in got}) >= 10
    for line, hyps in zip(lines, got, strict=True):
        [alone] = translator.translate_hypotheses([line], beam_size=beam_size)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone], line
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5), line
    texts = translator.translate(lines, beam_size=beam_size, max_tokens=MAX_TOKENS)
    assert texts == translator.tokenizer.decode_tgt([h[0].tokens for h in got])


def sampled_by_line(translator, model, batches, lines, seeds, **settings) -> list[list[int]]:
    """decode.sample on each recorded batch with its seed, the outputs put back on their lines (empty: [])."""
    eos, pad = translator.cfg.model.eos_id, translator.cfg.model.pad_id
    line_of = {tuple([*ids, eos]): i for i, ids in enumerate(translator.tokenizer.encode_src(lines)) if ids}
    limit = max_len_fn(DECODE.max_len_a, DECODE.max_len_b)
    out = [[] for _ in lines]
    for src, seed in zip(batches, seeds, strict=True):
        drawn = tokens(sample(model, src, decoding(limit, seed=seed, min_len=DECODE.min_len, **settings)))
        for row, ids in zip(src.tolist(), drawn):
            out[line_of[tuple(t for t in row if t != pad)]] = ids
    return out


def test_sampling_over_several_batches_seeds_batch_k_with_seed_plus_k(translator, lines):
    settings = {"temperature": 1.3, "top_k": 12}
    model = translator.model
    try:
        recorder = recorded(translator)
        got = translator.translate_hypotheses(lines, sampling={**settings, "seed": 5}, max_tokens=MAX_TOKENS)
    finally:
        translator.model = model
    batches = recorder.batches
    assert len(batches) >= 3 and sum(b.size(0) for b in batches) == len(lines) - 1
    want = sampled_by_line(translator, model, batches, lines, [5 + k for k in range(len(batches))], **settings)
    assert [h[0].tokens for h in got] == want
    # The rule matters here: one seed for every batch would draw other translations.
    assert want != sampled_by_line(translator, model, batches, lines, [5] * len(batches), **settings)
