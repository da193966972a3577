"""Decoding: cached vs uncached, beam vs greedy and vs exhaustive search over a table, edges, sampling."""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from conftest import KEPT, TIED_VOCAB, decoding, max_len_fn, random_src, random_transformer, tied_pair, tokens

from nanomt.core.config import ModelConfig
from nanomt.core.model import DecoderOutput, Encoded, Transformer, padding_mask
from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy
from nanomt.decoding.sample import sample
from nanomt.decoding.steps import Hypothesis, Targets

PAD, UNK, BOS, EOS, A, B, C = range(7)
V = 24


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------
# A tiny random Transformer.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_transformer(2, V)


make_src = functools.partial(random_src, vocab=V)


LENGTHS = [7, 3, 5, 1, 6, 8, 2, 4]


def reference_greedy(model: Transformer, src: torch.Tensor, max_len: int, min_len: int = 0) -> list[int]:
    """Greedy decoding of one (1, S) sentence without a cache: re-run the full prefix every step."""
    prefix = [BOS]
    for step in range(max_len):
        with torch.no_grad():
            logits = model(src, torch.tensor([prefix]))[0, -1]  # (V,)
        logits[[PAD, BOS]] = -math.inf
        if step < min_len:
            logits[EOS] = -math.inf
        token = int(logits.argmax())
        if token == EOS:
            break
        prefix.append(token)
    return prefix[1:]


def teacher_forced_log_prob(model: Transformer, src: torch.Tensor, targets: list[int]) -> float:
    """Sum of log p(target_i | BOS, targets_<i) for one (1, S) sentence."""
    with torch.no_grad():
        logits = model(src, torch.tensor([[BOS, *targets[:-1]]]))[0]  # (T, V)
    return float(logits.log_softmax(-1).gather(1, torch.tensor(targets)[:, None]).sum())


def test_fixture_gives_varied_outputs(model):
    out = tokens(greedy(model, make_src(LENGTHS), decoding(12)))
    assert len({tuple(o) for o in out}) >= 5
    assert any(len(o) < 12 for o in out) and any(len(o) == 12 for o in out)


@pytest.mark.parametrize("min_len", [0, 3])
def test_greedy_matches_uncached_reference(model, min_len):
    src = make_src(LENGTHS)
    out = tokens(greedy(model, src, decoding(12, min_len=min_len)))
    for i, n in enumerate(LENGTHS):
        assert out[i] == reference_greedy(model, src[i : i + 1, : n + 1], 12, min_len)


@pytest.mark.parametrize(("kind", "alpha"), [("gnmt", 1.0), ("average", 1.0), ("none", 1.0)])
@pytest.mark.parametrize("min_len", [0, 2])
def test_beam_size_one_equals_greedy(model, kind, alpha, min_len):
    src = make_src(LENGTHS, extra_pad=2)
    hyps = beam_search(model, src, decoding(12, 1, min_len=min_len, length_penalty=alpha, length_penalty_kind=kind))
    assert [h[0].tokens for h in hyps] == tokens(greedy(model, src, decoding(12, min_len=min_len)))


@pytest.mark.parametrize(("kind", "alpha"), [("gnmt", 0.6), ("average", 1.0), ("none", 0.0)])
def test_hypothesis_log_prob_and_score_match_teacher_forcing(model, kind, alpha):
    src = make_src(LENGTHS[:4])
    max_len = 8
    hyps = beam_search(model, src, decoding(max_len, 4, length_penalty=alpha, length_penalty_kind=kind, n_best=4))
    for i, n in enumerate(LENGTHS[:4]):
        for h in hyps[i]:
            ended = len(h.tokens) < max_len  # shorter than the budget: it ended with EOS
            targets = h.tokens + [EOS] if ended else h.tokens
            assert h.log_prob == pytest.approx(
                teacher_forced_log_prob(model, src[i : i + 1, : n + 1], targets), abs=1e-4
            )
            length = len(targets)
            penalty = {"gnmt": ((5 + length) / 6) ** alpha, "average": length**alpha, "none": 1.0}[kind]
            assert h.score == pytest.approx(h.log_prob / penalty, rel=1e-6)


def test_output_independent_of_batch_and_padding(model):
    src = make_src(LENGTHS, extra_pad=3)
    batch_greedy = tokens(greedy(model, src, decoding(10)))
    batch_beam = beam_search(model, src, decoding(10, 3, n_best=3))
    for i, n in enumerate(LENGTHS):
        alone = src[i : i + 1, : n + 1]
        assert batch_greedy[i] == tokens(greedy(model, alone, decoding(10)))[0]
        beam_alone = beam_search(model, alone, decoding(10, 3, n_best=3))[0]
        assert [h.tokens for h in batch_beam[i]] == [h.tokens for h in beam_alone]
        assert [h.score for h in batch_beam[i]] == pytest.approx([h.score for h in beam_alone], abs=1e-4)


def test_n_best_distinct_and_sorted(model):
    src = make_src(LENGTHS[:4])
    hyps = beam_search(model, src, decoding(10, 5, n_best=5))
    best = beam_search(model, src, decoding(10, 5, n_best=1))
    for sentence, top in zip(hyps, best, strict=True):
        assert len(sentence) == 5
        assert len({tuple(h.tokens) for h in sentence}) == 5
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
        assert sentence[0] == top[0]


@pytest.mark.parametrize("max_len", [1, 3, 7])
def test_max_len_bounds_output(model, max_len):
    src = make_src(LENGTHS)
    outputs = [
        tokens(greedy(model, src, decoding(max_len))),
        [h[0].tokens for h in beam_search(model, src, decoding(max_len, 3))],
        tokens(sample(model, src, decoding(max_len, seed=0))),
    ]
    for out in outputs:
        assert all(len(o) <= max_len for o in out)
        assert any(len(o) == max_len for o in out)


def test_train_mode_left_alone(model):
    src = make_src(LENGTHS[:2])
    try:
        model.train()
        tokens(greedy(model, src, decoding(4)))
        beam_search(model, src, decoding(4, 2))
        assert model.training
    finally:
        model.eval()
    tokens(greedy(model, src, decoding(4)))
    assert not model.training


def test_bad_arguments_raise(model):
    src = make_src(LENGTHS[:2])
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, src, decoding(5, 2, n_best=3))
    with pytest.raises(ValueError, match="length_penalty_kind"):
        beam_search(model, src, decoding(5, 2, length_penalty_kind="wu"))
    with pytest.raises(ValueError, match="max_len_a"):
        decoding(max_len_fn(-1.0, 5))
    assert all(len(o) <= 1 for o in tokens(greedy(model, src, decoding(0))))  # a budget is at least one token
    with pytest.raises(ValueError, match="top_p"):
        tokens(sample(model, src, decoding(5, top_p=0.0)))
    assert tokens(greedy(model, src[:0], decoding(5))) == [] and beam_search(model, src[:0], decoding(5, 2)) == []


# ---------------------------------------------------------------------------------------------------------
# Sampling.
# ---------------------------------------------------------------------------------------------------------


def test_sampling_deterministic_for_a_seed_and_varies_across_seeds(model):
    src = make_src(LENGTHS)
    assert tokens(sample(model, src, decoding(10, temperature=2.0, seed=7))) == tokens(
        sample(model, src, decoding(10, temperature=2.0, seed=7))
    )
    outputs = {str(tokens(sample(model, src, decoding(10, temperature=2.0, seed=s)))) for s in range(4)}
    assert len(outputs) == 4


@pytest.mark.parametrize(
    "kwargs", [{"top_k": 1}, {"top_k": 1, "temperature": 5.0}, {"temperature": 1e-4}, {"top_p": 1e-6}]
)
def test_sampling_degenerates_to_greedy(model, kwargs):
    src = make_src(LENGTHS)
    assert tokens(sample(model, src, decoding(12, seed=3, **kwargs))) == tokens(greedy(model, src, decoding(12)))


def test_sampling_leaves_global_rng_alone(model):
    src = make_src(LENGTHS)
    state = torch.get_rng_state()
    tokens(sample(model, src, decoding(10, seed=1)))
    tokens(sample(model, src, decoding(10, seed=None)))
    assert torch.equal(torch.get_rng_state(), state)


# Settings too small or too large for float32: top_p 1e-300 once compared as 0 and dropped every token, a temperature
# of 1e-300 divided by 0, one of 1e300 made the -inf of masked ids nan; multinomial raised on the nan.
VANISHING = [{"top_p": 1e-300}, {"top_p": 5e-324}, {"temperature": 1e-30}, {"temperature": 1e-300},
             {"temperature": 1e-300, "top_k": 1}, {"temperature": 1e-30, "top_p": 5e-324}]  # fmt: skip
EXTREME = [{"temperature": 1e3}, {"temperature": 1e300}, {"temperature": 1e3, "top_k": 1}, {"top_k": 1}]


@pytest.mark.parametrize("restricted", [False, True], ids=["random", "restricted"])
def test_sampling_at_extreme_settings_is_valid_and_at_vanishing_ones_greedy(model, restricted):
    """Any valid Sampling draws: allowed ids only, and greedy's tokens where the temperature or top_p vanishes, also
    where many ids are -inf (a restricted output, no_repeat_ngram_size 1) or all are (an unscored forced prefix)."""
    if restricted:
        m, _ = tied_pair()
        m.set_output_vocab(KEPT)
        src, allowed = random_src(LENGTHS, seed=3, vocab=TIED_VOCAB), set(KEPT.tolist()) - {EOS}
    else:
        m, src, allowed = model, make_src(LENGTHS), set(range(V)) - {PAD, BOS, EOS}
    for rules in ({}, {"no_repeat_ngram_size": 1}):
        expected = tokens(greedy(m, src, decoding(12, **rules)))
        for kwargs in VANISHING:
            assert tokens(sample(m, src, decoding(12, seed=3, **rules, **kwargs))) == expected, kwargs
        for kwargs in EXTREME:
            out = tokens(sample(m, src, decoding(12, seed=3, **rules, **kwargs)))
            assert all(set(o) <= allowed and len(o) <= 12 for o in out), kwargs
    if restricted:  # id 5 is not kept: the forced step's row is all -inf, and softmax over it was nan
        unscored = Targets(prefixes=[[5]] + [[]] * (len(LENGTHS) - 1))
        expected = tokens(greedy(m, src, decoding(12), unscored))
        for kwargs in VANISHING:
            assert tokens(sample(m, src, decoding(12, seed=3, **kwargs), unscored)) == expected, kwargs
        drawn = tokens(sample(m, src, decoding(12, seed=3), unscored))  # temperature 1: the forced step is greedy's
        assert drawn[0][0] == expected[0][0]


# ---------------------------------------------------------------------------------------------------------
# A stand-in model whose next-token distribution is a table indexed by the generated prefix.
# ---------------------------------------------------------------------------------------------------------

Table = dict[tuple[int, ...], dict[int, float]]


@dataclass(frozen=True)
class PrefixCache:
    """The stub's decoder cache: every token fed so far, BOS first."""

    prefixes: torch.Tensor  # (R, t)

    @property
    def length(self) -> int:
        return self.prefixes.size(1)

    def index_select(self, index: torch.Tensor, cross: bool = True) -> PrefixCache:
        return PrefixCache(self.prefixes.index_select(0, index))


class TableModel:
    """Transformer's encode/init_cache/decode interface over a probability table; records rows per step."""

    def __init__(self, table: Table, default: dict[int, float] | None = None, max_positions: int = 64):
        self.cfg = ModelConfig(src_vocab_size=7, tgt_vocab_size=7, d_model=2, n_heads=1, max_positions=max_positions)
        self.table = table
        self.default = default if default is not None else {EOS: 1.0}
        self.rows_per_step: list[int] = []

    def encode(self, src: torch.Tensor) -> Encoded:
        return Encoded(src[..., None].float(), padding_mask(src, PAD))

    def init_cache(self, enc: Encoded, capacity: int = 0) -> PrefixCache:
        return PrefixCache(torch.zeros(enc.memory.size(0), 0, dtype=torch.long))

    def decode(self, tgt: torch.Tensor, enc: Encoded, cache: PrefixCache) -> DecoderOutput:
        assert tgt.shape == (enc.memory.size(0), 1) == (cache.prefixes.size(0), 1)
        prefixes = torch.cat([cache.prefixes, tgt], dim=1)  # (R, t+1)
        self.rows_per_step.append(tgt.size(0))
        logits = torch.full((tgt.size(0), 1, 7), -math.inf)
        for r, prefix in enumerate(prefixes.tolist()):
            assert prefix[0] == BOS and EOS not in prefix
            for token, p in self.table.get(tuple(prefix[1:]), self.default).items():
                if p > 0:
                    logits[r, 0, token] = math.log(p)
        return DecoderOutput(logits, PrefixCache(prefixes))


def table_src(lengths: list[int]) -> torch.Tensor:
    """Sources for the stub (it ignores them, except for their lengths)."""
    src = torch.full((len(lengths), max(lengths) + 1), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = A
        src[i, n] = EOS
    return src


def penalized(log_prob: float, length: int, kind: str, alpha: float) -> float:
    if kind == "gnmt":
        return log_prob / ((5 + length) / 6) ** alpha
    if kind == "average":
        return log_prob / length**alpha
    return log_prob


def all_hypotheses(model: TableModel, max_len: int) -> list[tuple[list[int], float, int]]:
    """Every sequence the table can produce within max_len: (tokens, log_prob, length incl. EOS)."""
    out = []

    def extend(prefix: tuple[int, ...], log_prob: float) -> None:
        for token, p in model.table.get(prefix, model.default).items():
            lp = log_prob + math.log(p)
            if token == EOS:
                out.append((list(prefix), lp, len(prefix) + 1))
            elif len(prefix) + 1 == max_len:
                out.append(([*prefix, token], lp, max_len))
            else:
                extend((*prefix, token), lp)

    extend((), 0.0)
    return out


def random_table(seed: int, max_len: int) -> Table:
    g = torch.Generator().manual_seed(seed)
    table = {}
    for n in range(max_len):
        for prefix in itertools.product((A, B, C), repeat=n):
            probs = (torch.randn(4, generator=g) * 1.5).softmax(0).tolist()
            table[prefix] = dict(zip((EOS, A, B, C), probs, strict=True))
    return table


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("kind", "alpha"), [("none", 1.0), ("gnmt", 0.6), ("gnmt", 2.0), ("average", 1.0), ("average", 0.5)]
)
def test_wide_beam_matches_exhaustive_search(seed, kind, alpha):
    max_len = 4
    stub = TableModel(random_table(seed, max_len))
    # 3^4 sequences cut at max_len + 1 + 3 + 9 + 27 ending with EOS: a beam of 128 keeps them all.
    exhaustive = sorted(
        ((penalized(lp, n, kind, alpha), lp, tokens) for tokens, lp, n in all_hypotheses(stub, max_len)),
        key=lambda x: x[0],
        reverse=True,
    )
    hyps = beam_search(
        stub, table_src([1, 3]), decoding(max_len, 128, length_penalty=alpha, length_penalty_kind=kind, n_best=5)
    )
    for sentence in hyps:
        assert [h.tokens for h in sentence] == [tokens for _, _, tokens in exhaustive[:5]]
        assert [h.score for h in sentence] == pytest.approx([s for s, _, _ in exhaustive[:5]], abs=1e-5)
        assert [h.log_prob for h in sentence] == pytest.approx([lp for _, lp, _ in exhaustive[:5]], abs=1e-5)


# Greedy takes A (0.5) then A (0.36): 0.18. The best sequence is B EOS: 0.4 * 0.9 = 0.36.
GREEDY_TRAP = {(): {A: 0.5, B: 0.4, EOS: 0.1}, (A,): {A: 0.36, B: 0.34, C: 0.3}, (B,): {EOS: 0.9, C: 0.1}}


@pytest.mark.parametrize("kind", ["gnmt", "none"])
def test_beam_two_beats_greedy(kind):
    stub = TableModel(GREEDY_TRAP)
    src = table_src([2])
    assert tokens(greedy(stub, src, decoding(4))) == [[A, A]]
    (best,) = beam_search(stub, src, decoding(4, 2, length_penalty_kind=kind))[0]
    assert best.tokens == [B]
    assert best.log_prob == pytest.approx(math.log(0.36))


# k=2. Step 1 finishes [] (0.5); step 2 finishes [B] (0.18) while A C (0.27) is live; step 3 finishes A C.
STOP_TABLE = {(): {EOS: 0.5, A: 0.3, B: 0.2}, (A,): {EOS: 0.1, C: 0.9}, (B,): {EOS: 0.9, C: 0.1}}


def test_stopping_rule():
    stub = TableModel(STOP_TABLE)
    src = table_src([2])
    # Without a length penalty the search goes on while a live beam can still beat the worst kept hypothesis.
    hyps = beam_search(stub, src, decoding(4, 2, length_penalty_kind="none", n_best=2))[0]
    assert [h.tokens for h in hyps] == [[], [A, C]]
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.5), math.log(0.27)])
    # With alpha > 0 it stops at beam_size finished hypotheses (fairseq's rule), though A C scores higher.
    hyps = beam_search(stub, src, decoding(4, 2, length_penalty=1.0, length_penalty_kind="gnmt", n_best=2))[0]
    assert [h.tokens for h in hyps] == [[], [B]]


FLAT = {EOS: 0.7, A: 0.2, B: 0.1}


def test_model_that_ends_first_gives_empty_output():
    stub = TableModel({}, default=FLAT)
    src = table_src([2, 4])
    assert tokens(greedy(stub, src, decoding(5))) == [[], []]
    assert tokens(sample(stub, src, decoding(5, top_k=1, seed=0))) == [[], []]
    for (h,) in beam_search(stub, src, decoding(5, 3)):
        assert isinstance(h, Hypothesis) and h.tokens == []
        assert h.score == h.log_prob == pytest.approx(math.log(0.7))  # length 1: the GNMT penalty is 1


def test_min_len_forces_tokens():
    stub = TableModel({}, default=FLAT)
    src = table_src([2, 4])
    assert tokens(greedy(stub, src, decoding(10, min_len=3))) == [[A, A, A], [A, A, A]]
    for (h,) in beam_search(stub, src, decoding(10, 3, min_len=3)):
        assert h.tokens == [A, A, A]
        assert h.log_prob == pytest.approx(3 * math.log(0.2) + math.log(0.7))
    for seed in range(5):
        assert all(len(o) >= 3 for o in tokens(sample(stub, src, decoding(10, min_len=3, seed=seed))))


def test_min_len_above_max_len_cuts_at_max_len():
    stub = TableModel({}, default=FLAT)
    src = table_src([2])
    assert tokens(greedy(stub, src, decoding(2, min_len=5))) == [[A, A]]
    (h,) = beam_search(stub, src, decoding(2, 2, min_len=5))[0]
    assert h.tokens == [A, A]
    assert h.log_prob == pytest.approx(2 * math.log(0.2))  # no EOS: the hypothesis was cut


def test_max_len_function_of_source_length_and_finished_rows_dropped():
    src = table_src([1, 3, 6])
    limit = max_len_fn(1.0, 2)  # 3, 5, 8 tokens
    stub = TableModel({}, default={A: 1.0})
    assert [len(o) for o in tokens(greedy(stub, src, decoding(limit)))] == [3, 5, 8]
    assert stub.rows_per_step == [3, 3, 3, 2, 2, 1, 1, 1]
    stub = TableModel({}, default={A: 1.0})
    assert [h[0].tokens for h in beam_search(stub, src, decoding(limit, 2))] == [[A] * 3, [A] * 5, [A] * 8]
    assert stub.rows_per_step == [6, 6, 6, 4, 4, 2, 2, 2]
    assert [len(o) for o in tokens(sample(stub, src, decoding(max_len_fn(0.5, 1), seed=0)))] == [1, 2, 4]


def test_pad_and_bos_never_generated():
    stub = TableModel({}, default={PAD: 0.5, BOS: 0.3, A: 0.15, EOS: 0.05})
    src = table_src([2])
    assert tokens(greedy(stub, src, decoding(3))) == [[A, A, A]]
    assert tokens(sample(stub, src, decoding(3, top_k=1, seed=0))) == [[A, A, A]]
    for h in beam_search(stub, src, decoding(3, 3, n_best=3))[0]:
        assert set(h.tokens) <= {A}
        # Banned tokens are masked, not renormalized away: log-probs stay the model's own.
        assert h.log_prob == pytest.approx(len(h.tokens) * math.log(0.15) + (len(h.tokens) < 3) * math.log(0.05))


def test_max_len_capped_at_decoder_positions():
    stub = TableModel({}, default={A: 1.0}, max_positions=5)
    assert tokens(greedy(stub, table_src([2]), decoding(100))) == [[A] * 5]


SAMPLE_DEFAULT = {EOS: 0.2, A: 0.5, B: 0.3}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {EOS: 0.2, A: 0.5, B: 0.3}),
        ({"top_k": 2}, {A: 0.625, B: 0.375}),
        ({"top_p": 0.6}, {A: 0.625, B: 0.375}),  # A alone has 0.5 < 0.6, so B stays
        ({"top_p": 0.5}, {A: 1.0}),
        ({"temperature": 0.5}, {EOS: 0.04 / 0.38, A: 0.25 / 0.38, B: 0.09 / 0.38}),
    ],
)
def test_sampling_distribution(kwargs, expected):
    n = 4000
    stub = TableModel({}, default=SAMPLE_DEFAULT)
    out = tokens(sample(stub, table_src([1] * n), decoding(1, seed=0, **kwargs)))
    counts = Counter(o[0] if o else EOS for o in out)
    assert set(counts) == set(expected)
    for token, p in expected.items():
        assert counts[token] / n == pytest.approx(p, abs=0.03)
