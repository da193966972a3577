"""int8 inference: every linear layer quantized, per-row activation scales (a sentence decodes alone as in any
batch, cached as uncached), the products exact integer arithmetic, logits close to float32."""

import copy
import os
import subprocess
import sys

import pytest
import torch
from conftest import decoding, random_src, random_transformer, tokens
from torch import nn

from nanomt.core.config import Config, DataConfig, DecodeConfig, ModelConfig
from nanomt.core.model import DecoderOutput, Transformer
from nanomt.core.tokenizer import train_tokenizer
from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy
from nanomt.decoding.quantize import LEVELS, Int8Linear, is_quantized, quantize_int8, quantize_rows
from nanomt.decoding.translate import Translator

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(50, 50, d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=128, dropout=0.0)
    return Transformer(cfg).eval()


def test_every_linear_is_int8_and_the_float_model_is_untouched(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantize_int8(model)
    assert is_quantized(q) and not is_quantized(model)
    assert not any(type(m) is nn.Linear for m in q.modules())  # the tied output projection too
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # Per-channel weight scales: one per output row, each row's largest weight at +-127.
    w1 = q.decoder[0].ffn.w1
    assert w1.weight_int8.dtype == torch.int8 and w1.weight_scale.shape == (128,)
    assert torch.equal(w1.weight_int8.abs().amax(dim=1), torch.full((128,), 127, dtype=torch.int8))
    ref = model.decoder[0].ffn.w1.weight
    assert ((w1.weight_int8 * w1.weight_scale[:, None] - ref).abs() <= w1.weight_scale[:, None] / 2 + 1e-7).all()
    src, tgt = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 4))
    with torch.inference_mode():  # a copy packs its own weights and computes the same
        assert torch.equal(copy.deepcopy(q)(src, tgt), q(src, tgt))


def test_rows_are_coded_each_with_its_own_step():
    x = torch.tensor([[0.5, -2.0, 1.0, 0.25], [0.0, 0.0, 0.0, 0.0], [3e-3, 1e-3, -1e-3, 0.0]])
    batch = torch.cat([x, 1000 * x[:1]])
    codes, amax = quantize_rows(batch)
    alone, alone_amax = quantize_rows(x[2:3])
    assert torch.equal(codes[2:3], alone) and torch.equal(amax[2:3], alone_amax)  # the large row changes nothing
    assert amax[:, 0].tolist() == pytest.approx([2.0, 1e-30, 3e-3, 2000.0], rel=1e-6)
    assert codes[0].tolist() == [16, -LEVELS, 32, 8]  # 0.5 is 15.75 steps of 2 / 63: 16
    assert codes[1].tolist() == [0] * 4  # an all-zero row (padding) codes to zeros, not NaN
    assert codes[2].tolist() == [LEVELS, 21, -21, 0]
    assert torch.equal(codes[3], codes[0])
    step = amax / LEVELS
    assert (codes * step - batch).abs().le(step / 2 * 1.0001).all()


def exact_int8_linear(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """The layer's output computed in float64 from its integer codes: what the int32 sums must give."""
    codes, amax = quantize_rows(x)
    sums = codes.double() @ layer.weight_int8.double().T  # exact integers
    return sums * (amax.double() / LEVELS) * layer.weight_scale.double() + layer.bias.double()


@pytest.mark.parametrize("int_mm_rows", [sys.maxsize, 0], ids=["int_mm", "qlinear"])
def test_int8_linear_is_exact_integer_arithmetic_on_its_codes(int_mm_rows):
    torch.manual_seed(0)
    layer = Int8Linear.from_float(nn.Linear(96, 40))
    layer = Int8Linear(layer.weight_int8, layer.weight_scale, layer.bias, int_mm_rows)
    x = torch.randn(2, 7, 96) * torch.rand(2, 7, 1) * 10  # (B, T, K): rows of different sizes
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (2, 7, 40) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), exact_int8_linear(layer, x), rtol=1e-6, atol=1e-5)


def test_both_kernels_give_the_same_bits():
    # A layer sends small calls to torch._int_mm and larger ones to oneDNN's qlinear: a sentence alone and in a
    # batch may take different kernels, so these must agree to the last bit.
    torch.manual_seed(0)
    for n_in, n_out in [(64, 48), (256, 1000)]:
        a = Int8Linear.from_float(nn.Linear(n_in, n_out))
        int_mm, qlinear = (Int8Linear(a.weight_int8, a.weight_scale, a.bias, rows) for rows in (sys.maxsize, 0))
        for rows in (1, 5, 70):
            x = torch.randn(rows, n_in) * torch.rand(rows, 1) * 10
            with torch.inference_mode():
                assert torch.equal(int_mm(x), qlinear(x)), (n_in, n_out, rows)


AVX2_CHECK = """
import torch
from torch import nn
from nanomt.decoding.quantize import LEVELS, Int8Linear, quantize_rows
torch.manual_seed(0)
layer = Int8Linear.from_float(nn.Linear(512, 256))
layer = Int8Linear(layer.weight_int8, layer.weight_scale, layer.bias, 0)  # what a CPU without VNNI runs
x = torch.randn(64, 512)
codes, amax = quantize_rows(x)
exact = (codes.double() @ layer.weight_int8.double().T) * amax.double() / LEVELS
exact = exact * layer.weight_scale.double() + layer.bias.double()
print(float((layer(x).double() - exact).abs().max() / exact.abs().max()))
"""


def test_int8_codes_do_not_saturate_a_cpu_without_vnni():
    # oneDNN's AVX2 kernels (no VNNI) sum pairs of u8 x s8 products in 16 bits: with codes up to 2 * 127 + 1 the
    # sums saturate and come out wrong, silently; the codes nanomt uses stay within 127. ONEDNN_MAX_CPU_ISA makes
    # oneDNN choose as it would on such a CPU.
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", AVX2_CHECK], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 1e-5


def test_int8_logits_are_close_to_float32(model):
    src = torch.randint(4, 50, (3, 7))
    tgt = torch.randint(4, 50, (3, 5))
    with torch.inference_mode():
        ref = model(src, tgt)
        out = quantize_int8(model)(src, tgt)
    # 8-bit weights and 7-bit activations through 4 layers and the output projection: a few percent of the
    # logits (about 3% here), not zero (it is quantized) and far from a broken layer's 100%.
    err = (out - ref).norm() / ref.norm()
    assert 0 < err < 0.06, err


def test_int8_decoding_uses_the_cache_like_float32(model):
    q = quantize_int8(model)
    src = torch.cat([torch.randint(4, 50, (4, 6)), torch.full((4, 1), 3)], dim=1)
    out = tokens(greedy(q, src, decoding(8, min_len=8)))
    # Teacher-forcing the greedy output through the uncached int8 model gives back every argmax: each row is
    # quantized on its own, so 1 new token a step and the whole sequence at once see the same codes.
    tgt_in = torch.tensor([[2] + o[:-1] for o in out])
    with torch.inference_mode():
        logits = q(src, tgt_in)
        logits[..., [0, 2, 3]] = float("-inf")  # PAD and BOS are never generated, EOS is blocked by min_len
    assert logits.argmax(-1).tolist() == out


def test_int8_refuses_a_model_off_the_cpu(model):
    with pytest.raises(ValueError, match="CPU only"):
        quantize_int8(model.to("meta"))


# ---------------------------------------------------------------------------------------------------------
# Decoding: cached equals uncached, and a sentence alone equals the sentence in a batch.
# ---------------------------------------------------------------------------------------------------------


class Prefix:
    """An uncached model's "cache": the tokens fed so far, (R, t), reordered as beam search reorders rows."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens, self.length = tokens, tokens.size(1)

    def index_select(self, index: torch.Tensor, cross: bool = True) -> "Prefix":
        return Prefix(self.tokens.index_select(0, index))


class Uncached:
    """A model decoded without its KV cache: every step runs the decoder over the whole prefix again."""

    def __init__(self, model: Transformer):
        self.model, self.cfg = model, model.cfg

    def encode(self, src: torch.Tensor):
        return self.model.encode(src)

    def init_cache(self, enc, capacity: int = 0) -> Prefix:
        return Prefix(enc.memory.new_zeros((enc.memory.size(0), 0), dtype=torch.long))

    def decode(self, tgt: torch.Tensor, enc, cache: Prefix, restricted: bool = False) -> DecoderOutput:
        prefix = torch.cat([cache.tokens, tgt], dim=1)  # (R, t + 1)
        logits = self.model.decode(prefix, enc, restricted=restricted).logits[:, -tgt.size(1) :]
        return DecoderOutput(logits, Prefix(prefix))


LENGTHS = [7, 3, 5, 1, 6, 8, 2, 4]


def decode_all(model, src: torch.Tensor, k: int) -> list[list[tuple[list[int], float]]]:
    """Each sentence's (tokens, score) hypotheses: greedy's one at k = 1, else beam search's k best."""
    with torch.inference_mode():
        if k == 1:
            return [[(out, 0.0)] for out in tokens(greedy(model, src, decoding(12)))]
        return [[(h.tokens, h.score) for h in hs] for hs in beam_search(model, src, decoding(12, k, n_best=k))]


def test_uncached_reference_decodes_float32_as_the_cache_does():
    model = random_transformer(2, 24)
    src = random_src(LENGTHS, extra_pad=2, vocab=24)
    for k in (1, 4):
        assert [[t for t, _ in hyps] for hyps in decode_all(Uncached(model), src, k)] == [
            [t for t, _ in hyps] for hyps in decode_all(model, src, k)
        ]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_cached_int8_decoding_equals_uncached_int8_decoding(beam_size):
    q = quantize_int8(random_transformer(7, 40))
    src = random_src(LENGTHS * 2, seed=1, extra_pad=2, vocab=40)
    cached, uncached = decode_all(q, src, beam_size), decode_all(Uncached(q), src, beam_size)
    assert len({str(hyps[0][0]) for hyps in cached}) >= 10  # varied outputs
    assert [[t for t, _ in hyps] for hyps in cached] == [[t for t, _ in hyps] for hyps in uncached]
    # Scores to about one code step: attention's float32 sums over 1 query and over all of them may differ in
    # the last bit, which can move an activation code by one (a few 1e-3 of a log-probability).
    scores = [s for hyps in cached for _, s in hyps]
    assert scores == pytest.approx([s for hyps in uncached for _, s in hyps], abs=1e-2)


@pytest.fixture(scope="module")
def int8_translator(toy_corpus, tmp_path_factory) -> Translator:
    """An int8 Translator of a random model with the toy pair's tokenizer."""
    data = DataConfig(vocab_size=120, shared_vocab=True)
    lines = [toy_corpus[f"train.{side}"].read_text(encoding="utf-8").splitlines() for side in ("src", "tgt")]
    tokenizer = train_tokenizer(*lines, tmp_path_factory.mktemp("tokenizer"), data)
    model = random_transformer(4, tokenizer.src_vocab_size)
    decode = DecodeConfig(max_len_a=1.0, max_len_b=4)
    return Translator(model, tokenizer, Config(model=model.cfg, data=data, decode=decode), int8=True)


@pytest.fixture(scope="module")
def same_length_lines(toy_corpus, int8_translator) -> list[str]:
    """64 distinct toy sentences of 12 source tokens each."""
    lines = toy_corpus["train.src"].read_text(encoding="utf-8").splitlines()
    lines = list(dict.fromkeys(lines))[:3000]
    ids = int8_translator.tokenizer.encode_src(lines)
    return [line for line, s in zip(lines, ids) if len(s) == 12][:64]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_int8_sentence_translates_alone_as_in_a_batch_of_64(int8_translator, same_length_lines, beam_size):
    # Sentences of one length: no padding, so that every float32 part (attention's sums) sees the same shapes
    # alone and in the batch and gives the same bits; what is left to differ is the int8 layers' scales. (Over
    # padding float32 attention may differ in the last bit, in float32 too, which an int8 code can amplify.)
    lines = same_length_lines
    assert len(lines) == 64 and is_quantized(int8_translator.model)
    # One batch of all 64 (max_tokens holds them), then each sentence by itself.
    batch = int8_translator.translate_hypotheses(lines, beam_size=beam_size, max_tokens=10**6)
    assert len({tuple(h[0].tokens) for h in batch}) >= 20
    for line, hyps in zip(lines, batch, strict=True):
        [alone] = int8_translator.translate_hypotheses([line], beam_size=beam_size)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone], line
