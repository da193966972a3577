"""Translator and `nanomt translate` decode with the checkpoint's settings, checked on models with known outputs.

The models here are Transformers without layers whose weights are a next-token table: the decoder's output is
the embedding of the previous token (post-norm, so no final LayerNorm), a one-hot vector picking one column of
the output projection, and that column holds the log-probabilities of the next token. Every hypothesis, its
log-probability and so its length-penalized score is then known in advance.
"""

import math

import pytest
import torch
from conftest import KEPT, TIED_VOCAB, decoding, max_len_fn, random_src, run_nanomt, tied_pair, tiny_config, tokens

from nanomt.core.checkpoint import load_checkpoint, model_state, write_checkpoint_dir
from nanomt.core.config import Config, DataConfig, DecodeConfig, ModelConfig, config_from_dict
from nanomt.core.model import Transformer
from nanomt.core.runtime import DeviceError
from nanomt.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, train_tokenizer
from nanomt.decoding.beam import beam_search
from nanomt.decoding.ensemble import Ensemble
from nanomt.decoding.greedy import greedy
from nanomt.decoding.translate import Translator

D_MODEL = 16
# Log-probability of every token a table row does not list: never chosen while a listed token can be.
FLOOR = -30.0
SOURCES = ["la fesa dormat.", "una zira un musko serur lemat.", "li muski la rina tirant e la fesa dunur dormat."]
DEFAULTS = DecodeConfig()

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------
# Table models, their checkpoints and their hypotheses.
# ---------------------------------------------------------------------------------------------------------

Row = dict[int, float]  # next token -> probability


def table_model(vocab: int, rows: dict[int, Row], default: Row | None = None) -> Transformer:
    """p(next | previous token) = rows[previous], or `default` for tokens without a row (uniform when empty)."""
    cfg = ModelConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=D_MODEL,
        n_heads=1,
        n_encoder_layers=0,
        n_decoder_layers=0,
        d_ff=D_MODEL,
        dropout=0.0,
        max_positions=64,
        positional="learned",  # zeroed below: the output depends on the previous token only
        norm_first=False,  # no LayerNorm after the (empty) decoder stack
    )
    assert len(rows) < D_MODEL
    model = Transformer(cfg).eval()
    columns = [default or {}, *rows.values()]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        slot = {token: i for i, token in enumerate(rows, start=1)}
        for token in range(vocab):  # embeddings are scaled by sqrt(d_model): 1/4 * 4 = 1 exactly
            model.tgt_embed.tokens.weight[token, slot.get(token, 0)] = 1.0 / math.sqrt(D_MODEL)
        for j, column in enumerate(columns):
            model.output.weight[:, j] = FLOOR if column else 0.0
            for token, p in column.items():
                model.output.weight[token, j] = math.log(p)
    return model


def chain(tokens: list[int], eos_probs: list[float]) -> dict[int, Row]:
    """BOS -> tokens[0] -> tokens[1] ...: EOS with probability eos_probs[i] after i tokens, and after the last."""
    rows, previous = {}, BOS_ID
    for token, p in zip(tokens, eos_probs, strict=True):
        rows[previous] = {EOS_ID: p, token: 1.0 - p}
        previous = token
    rows[previous] = {EOS_ID: 1.0}
    return rows


def chain_hypotheses(tokens: list[int], eos_probs: list[float]) -> list[tuple[list[int], float]]:
    """Every hypothesis of `chain(tokens, eos_probs)` with its log-probability: tokens[:i] then EOS."""
    out, continued = [], 0.0
    for i, p in enumerate([*eos_probs, 1.0]):
        out.append((tokens[:i], continued + math.log(p)))
        continued += math.log1p(-p) if i < len(eos_probs) else 0.0
    return out


def penalized(log_prob: float, length: int, kind: str, alpha: float) -> float:
    """Decoding.penalty's score; `length` counts EOS."""
    return log_prob / {"gnmt": ((5 + length) / 6) ** alpha, "average": length**alpha, "none": 1.0}[kind]


def ranked(hyps: list[tuple[list[int], float]], kind: str, alpha: float, min_len: int = 0) -> list[tuple[list, float]]:
    """(tokens, score) of the hypotheses with at least min_len tokens, best first."""
    scored = [(t, penalized(lp, len(t) + 1, kind, alpha)) for t, lp in hyps if len(t) >= min_len]
    return sorted(scored, key=lambda h: h[1], reverse=True)


def write_checkpoint(path, model: Transformer, tokenizer_dir, **decode) -> str:
    """A checkpoint directory of `model` whose config.yaml has these decode settings (the rest: defaults)."""
    cfg = Config(model=model.cfg, data=DataConfig(vocab_size=model.cfg.tgt_vocab_size), decode=DecodeConfig(**decode))
    return str(write_checkpoint_dir(path, cfg, tokenizer_dir, model_state(model)))


@pytest.fixture(scope="module")
def vocab(toy_corpus, tmp_path_factory):
    """(tokenizer, its directory, four target word ids in increasing order)."""
    out = tmp_path_factory.mktemp("tokenizer")
    lines = {name: toy_corpus[name].read_text(encoding="utf-8").splitlines() for name in ("train.src", "train.tgt")}
    tokenizer = train_tokenizer(
        lines["train.src"], lines["train.tgt"], out, DataConfig(vocab_size=120, shared_vocab=False)
    )
    words = [i for i in range(tokenizer.tgt_vocab_size) if len(p := tokenizer.tgt_pieces([i])[0]) >= 4 and p[0] == "▁"]
    return tokenizer, out, words[:4]


def src_lengths(tokenizer) -> list[int]:
    """Source tokens of each of SOURCES, as max_len_a counts them (no EOS)."""
    lengths = [len(ids) for ids in tokenizer.encode_src(SOURCES)]
    assert len(set(lengths)) == len(lengths)
    return lengths


def cli(*args, input=None):
    return run_nanomt(*args, input=input, text=True)


# ---------------------------------------------------------------------------------------------------------
# The Translator follows the checkpoint's decode section.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize(("a", "b"), [(0.0, 3), (1.5, 0), (0.5, 2)])
def test_max_len_a_and_b_come_from_the_config(vocab, tmp_path, beam_size, a, b):
    # One word again and again, EOS never: every output is as long as the budget, int(a * src_len + b).
    tokenizer, tokenizer_dir, words = vocab
    model = table_model(tokenizer.tgt_vocab_size, {}, default={words[0]: 1.0})
    ckpt = write_checkpoint(tmp_path / "ckpt", model, tokenizer_dir, beam_size=beam_size, max_len_a=a, max_len_b=b)
    translator = Translator.from_checkpoint(ckpt)
    budgets = [int(a * n + b) for n in src_lengths(tokenizer)]
    assert budgets != [int(DEFAULTS.max_len_a * n + DEFAULTS.max_len_b) for n in src_lengths(tokenizer)]
    assert [len(h[0].tokens) for h in translator.translate_hypotheses(SOURCES)] == budgets
    assert translator.translate(SOURCES) == tokenizer.decode_tgt([[words[0]] * n for n in budgets])


def test_what_is_no_list_of_sentences_is_refused_by_every_door(vocab, tmp_path):
    """One str (which would be translated a character at a time) and a list holding something else: a TypeError
    naming it, from translate, the hypotheses, n-best, alignments and the server's check alike."""
    tokenizer, tokenizer_dir, words = vocab
    model = table_model(tokenizer.tgt_vocab_size, {}, default={words[0]: 1.0})
    translator = Translator.from_checkpoint(write_checkpoint(tmp_path / "ckpt", model, tokenizer_dir))
    doors = [
        translator.translate,
        translator.translate_hypotheses,
        translator.translate_n_best,
        translator.alignments,
        lambda s: translator.check(s, translator.default_decoding),
    ]
    for door in doors:
        with pytest.raises(TypeError, match=r"a list of str, got one str"):
            door(SOURCES[0])
        with pytest.raises(TypeError, match=r"sentence 2 is a NoneType, not a str"):
            door([SOURCES[0], None])
    assert len(translator.translate(SOURCES[:1])) == 1
    with pytest.raises(ValueError, match="beam_size must be an integer, got 2.5"):  # torch's TypeError, deep inside
        translator.translate(SOURCES[:1], beam_size=2.5)


def test_a_device_this_machine_lacks_is_named_when_the_checkpoint_loads(vocab, tmp_path):
    tokenizer, tokenizer_dir, words = vocab
    ckpt = write_checkpoint(tmp_path / "ckpt", table_model(tokenizer.tgt_vocab_size, {}), tokenizer_dir)
    with pytest.raises(DeviceError, match="device nope: not a device name"):
        Translator.from_checkpoint(ckpt, device="nope")
    with pytest.raises(DeviceError, match="device nope: not a device name"):
        Translator.from_checkpoints([ckpt, ckpt], device="nope")
    if not torch.cuda.is_available():  # it was torch's AssertionError "Torch not compiled with CUDA enabled"
        with pytest.raises(DeviceError, match="device cuda: CUDA is not available"):
            Translator.from_checkpoint(ckpt, device="cuda")
    assert Translator.from_checkpoint(ckpt, device="auto").device.type == (
        "cuda" if torch.cuda.is_available() else "cpu"
    )


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("min_len", [0, 1, 2, 3])
def test_min_len_comes_from_the_config(vocab, tmp_path, beam_size, min_len):
    # EOS is the likeliest token after every prefix: the output is the shortest one min_len allows.
    tokenizer, tokenizer_dir, words = vocab
    model = table_model(tokenizer.tgt_vocab_size, chain(words[:3], [0.9, 0.9, 0.9]))
    ckpt = write_checkpoint(tmp_path / "ckpt", model, tokenizer_dir, beam_size=beam_size, min_len=min_len)
    translator = Translator.from_checkpoint(ckpt)
    assert [h[0].tokens for h in translator.translate_hypotheses(SOURCES)] == [words[:min_len]] * len(SOURCES)
    assert translator.translate(SOURCES) == tokenizer.decode_tgt([words[:min_len]] * len(SOURCES))


# Four hypotheses ("", w0, w0 w1, w0 w1 w2) whose best under each setting below differs from the best under the
# same setting with the kind or alpha put back to its default (gnmt, 1.0): a Translator that ignored either
# would translate differently.
CHAIN4 = [0.35, 0.5, 0.5]
SETTINGS = [("gnmt", 1.0), ("none", 1.0), ("average", 1.0), ("gnmt", 3.0), ("average", 0.5)]


@pytest.mark.parametrize(("kind", "alpha"), SETTINGS)
def test_length_penalty_and_its_kind_come_from_the_config(vocab, tmp_path, kind, alpha):
    tokenizer, tokenizer_dir, words = vocab
    model = table_model(tokenizer.tgt_vocab_size, chain(words[:3], CHAIN4))
    ckpt = write_checkpoint(
        tmp_path / "ckpt", model, tokenizer_dir, beam_size=4, length_penalty=alpha, length_penalty_kind=kind
    )
    hyps = chain_hypotheses(words[:3], CHAIN4)
    best, score = ranked(hyps, kind, alpha)[0]
    one_ignored = {(DEFAULTS.length_penalty_kind, alpha), (kind, DEFAULTS.length_penalty)} - {(kind, alpha)}
    assert any(ranked(hyps, *other)[0][0] != best for other in one_ignored) or not one_ignored
    translator = Translator.from_checkpoint(ckpt)
    assert translator.translate(SOURCES) == tokenizer.decode_tgt([best] * len(SOURCES))
    for [(_, got)] in translator.translate_n_best(SOURCES, n_best=1):
        assert got == pytest.approx(score, abs=1e-5)


# ---------------------------------------------------------------------------------------------------------
# `nanomt translate`: the same settings, --n-best rows as beam_search gives them, --int8.
# ---------------------------------------------------------------------------------------------------------

# Five hypotheses ("", w0, ..., w0 w1 w2 w3). Under the config below (min_len 1, average, alpha 0.5) the four
# with at least one token come in an order that differs from the order under gnmt (kind ignored) and under
# alpha 1.0 (alpha ignored); without min_len the empty one would be among them.
CHAIN5 = [0.8, 0.2, 0.9, 0.3]
CLI_DECODE = {"beam_size": 4, "min_len": 1, "length_penalty_kind": "average", "length_penalty": 0.5}


def test_cli_n_best_rows_are_beam_search_hypotheses(vocab, tmp_path):
    tokenizer, tokenizer_dir, words = vocab
    model = table_model(tokenizer.tgt_vocab_size, chain(words, CHAIN5))
    ckpt = write_checkpoint(tmp_path / "ckpt", model, tokenizer_dir, **CLI_DECODE)
    res = cli("translate", ckpt, "--n-best", 4, input="\n".join(SOURCES[:2]) + "\n")
    assert res.returncode == 0, res.stderr
    rows = [line.split("\t") for line in res.stdout.splitlines()]

    # The reference: beam_search with the config's settings spelled out, on the model as loaded.
    loaded, _, _ = load_checkpoint(ckpt)
    ids = tokenizer.encode_src(SOURCES[:2])
    src = torch.full((2, max(map(len, ids)) + 1), PAD_ID)
    for i, s in enumerate(ids):
        src[i, : len(s) + 1] = torch.tensor([*s, EOS_ID])
    expected = beam_search(
        loaded,
        src,
        decoding(
            max_len_fn(DEFAULTS.max_len_a, DEFAULTS.max_len_b),
            4,
            min_len=1,
            length_penalty=0.5,
            length_penalty_kind="average",
            n_best=4,
        ),
    )
    assert rows == [
        [str(i), f"{h.score:.4f}", tokenizer.decode_tgt([h.tokens])[0]] for i, hyps in enumerate(expected) for h in hyps
    ]

    # ... and the known hypotheses of the table, in the order the config's settings give.
    hyps = chain_hypotheses(words, CHAIN5)
    best = ranked(hyps, "average", 0.5, min_len=1)
    for other in (ranked(hyps, "gnmt", 0.5, 1), ranked(hyps, "average", 1.0, 1), ranked(hyps, "average", 0.5)):
        assert [t for t, _ in other[:4]] != [t for t, _ in best]
    for i in range(2):
        assert [r[2] for r in rows[4 * i : 4 * i + 4]] == tokenizer.decode_tgt([t for t, _ in best])
        assert [float(r[1]) for r in rows[4 * i : 4 * i + 4]] == pytest.approx([s for _, s in best], abs=6e-5)


def test_cli_int8_decodes_with_the_int8_model_and_max_len_from_the_config(vocab, tmp_path):
    # Two words tie in int8 but not in float32: the later id is ahead by 0.01 in float32, and both rows of the
    # output projection share their largest weight (10, in a column no token selects), so that both get the
    # same int8 scale and 0.01 rounds to 0. Tied logits pick the lower id, so float32 and int8 repeat different
    # words, each for the config's budget (EOS is never likely).
    tokenizer, tokenizer_dir, words = vocab
    low, high = words[:2]
    model = table_model(tokenizer.tgt_vocab_size, {}, default={low: 0.5, high: 0.5})
    with torch.no_grad():
        model.output.weight[low, 0] = 0.0
        model.output.weight[high, 0] = 0.01
        model.output.weight[[low, high], 1] = 10.0
    a, b = 0.5, 2
    ckpt = write_checkpoint(tmp_path / "ckpt", model, tokenizer_dir, beam_size=1, max_len_a=a, max_len_b=b)
    budgets = [int(a * n + b) for n in src_lengths(tokenizer)]
    want_float = tokenizer.decode_tgt([[high] * n for n in budgets])
    want_int8 = tokenizer.decode_tgt([[low] * n for n in budgets])
    assert all(f != q for f, q in zip(want_float, want_int8))

    assert Translator.from_checkpoint(ckpt).translate(SOURCES) == want_float
    assert Translator.from_checkpoint(ckpt, int8=True).translate(SOURCES) == want_int8
    res = cli("translate", ckpt, "--int8", input="\n".join(SOURCES) + "\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == want_int8


def test_translator_decodes_restricted_models_through_the_pruned_projection(toy_corpus, tmp_path):
    restricted, full = tied_pair(seed=3)
    src = random_src([6, 4, 7], seed=2, vocab=TIED_VOCAB)
    chosen = {t for row in tokens(greedy(full, src, decoding(12))) for t in row}
    restricted.set_output_vocab(torch.tensor([i for i in range(TIED_VOCAB) if i not in chosen]))
    tok = None  # Translator's model and decoding do not need the tokenizer here
    cfg = config_from_dict(tiny_config(toy_corpus))
    float32 = Translator(restricted, tok, cfg).model
    assert float32.output.out_features == len(restricted.output_ids) < TIED_VOCAB
    assert restricted.output.out_features == TIED_VOCAB  # the model given is not changed
    with torch.inference_mode():
        assert tokens(greedy(float32, src, decoding(12))) == tokens(greedy(restricted, src, decoding(12)))
        ref = [[h.tokens for h in hyps] for hyps in beam_search(restricted, src, decoding(12, 3, n_best=3))]
        assert [[h.tokens for h in hyps] for hyps in beam_search(float32, src, decoding(12, 3, n_best=3))] == ref
        int8 = Translator(restricted, tok, cfg, int8=True).model
        assert int8.output.out_features == len(restricted.output_ids)  # quantized after pruning: K rows
        tgt = random_src([4, 6], seed=1, vocab=TIED_VOCAB)
        out, want = int8(src[:2], tgt), restricted(src[:2], tgt)
        ensemble = Translator(Ensemble([restricted, full]), tok, cfg).model
    assert torch.equal(torch.isneginf(out), torch.isneginf(want))
    kept = restricted.output_ids
    assert (out[..., kept] - want[..., kept]).norm() / want[..., kept].norm() < 0.06  # int8's error, as elsewhere
    assert ensemble.members[0].output.out_features < TIED_VOCAB and ensemble.members[1] is full


def test_a_model_built_to_be_loaded_draws_no_random_numbers_and_loads_to_the_same_model():
    """Transformer(cfg, init=False), as the checkpoint loader builds it: no weight drawn, the loaded model exact."""
    torch.manual_seed(0)
    cfg = ModelConfig(TIED_VOCAB, TIED_VOCAB, d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64)
    trained = Transformer(cfg).eval()
    rng = torch.get_rng_state()
    loaded = Transformer(cfg, init=False)
    assert torch.equal(torch.get_rng_state(), rng)  # nn.Linear's and nn.Embedding's own initialization skipped
    loaded.load_state_dict(trained.state_dict())
    src, tgt = random_src([5, 3], seed=1, vocab=TIED_VOCAB), random_src([4, 2], seed=2, vocab=TIED_VOCAB)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(src, tgt), trained(src, tgt))


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("kind", ["restricted", "unrestricted", "ensemble"])
def test_a_translator_leaves_the_callers_model_as_it_was(kind, int8):
    """Pruning and int8 copy a model the caller still holds (a training run's); only a model the Translator loaded
    itself (copy_model=False) is changed in place, with no second copy of its weights."""

    def made(kind: str):
        restricted, full = tied_pair()
        restricted.set_output_vocab(KEPT)
        return {"restricted": restricted, "unrestricted": full, "ensemble": Ensemble([full, tied_pair(1)[1]])}[kind]

    def layers(model) -> list:
        return [(type(m), getattr(m, "out_features", None)) for m in model.modules()]

    model = made(kind)
    before, shape = {k: v.clone() for k, v in model.state_dict().items()}, layers(model)
    Translator(model, None, Config(model=model.cfg, data=DataConfig()), int8=int8)
    assert layers(model) == shape and before.keys() == model.state_dict().keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())

    own = made(kind)
    Translator(own, None, Config(model=own.cfg, data=DataConfig()), int8=int8, copy_model=False)
    assert (layers(own) != shape) == (int8 or kind == "restricted")
