"""The exported ONNX graphs are the checkpoint's own model on any batch: the encoder on padded batches, the decoder
step fed its own cache, the greedy loop, each for sentences of different lengths, extra padding, any order, alone,
and every variant of test_export.py's checkpoints (and learned positions)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import VARIANTS, padded, variant_config

from nanomt.decoding.translate import Translator

pytestmark = pytest.mark.slow  # a foreign runtime: onnxruntime sessions of every variant

# test_export's checkpoints, and learned positions (a table the decoder step indexes by the cache's length).
ONNX_VARIANTS = {
    **VARIANTS,
    "learned_post_norm": ({}, {"positional": "learned", "norm_first": False, "activation": "gelu"}, {}),
}
TOL = 1e-4


@pytest.fixture(scope="module")
def exports(toy_corpus, trained, tmp_path_factory, one_thread) -> dict[str, tuple[Path, Path]]:
    """Each variant trained a few dozen steps (test_export.py's runs: conftest's `trained` trains each once) and
    exported: (run, onnx directory)."""
    pytest.importorskip("onnxruntime")
    from nanomt.interop.onnx import export_onnx

    out = {}
    for name, variant in ONNX_VARIANTS.items():
        run = trained(variant_config(toy_corpus, *variant))
        out[name] = (run, export_onnx(run, tmp_path_factory.mktemp(name) / "onnx"))
    return out


@pytest.fixture(scope="module")
def test_lines(toy_corpus) -> dict[str, list[str]]:
    return {side: toy_corpus[f"test.{side}"].read_text(encoding="utf-8").splitlines() for side in ("src", "tgt")}


def source_rows(translator: Translator, sentences: list[str]) -> list[list[int]]:
    """Each sentence's source ids with EOS, as the model reads them."""
    return [ids + [translator.cfg.model.eos_id] for ids in translator.tokenizer.encode_src(sentences)]


def different_lengths(translator: Translator, lines: list[str], n: int = 6) -> list[int]:
    """Indices of n lines whose source lengths all differ, the shortest to the longest, not in length order."""
    first = {}
    for i, row in enumerate(source_rows(translator, lines)):
        first.setdefault(len(row), i)
    by_length = [first[length] for length in sorted(first)]
    assert len(by_length) >= n, "the test set has too few different lengths"
    picked = [by_length[round(k * (len(by_length) - 1) / (n - 1))] for k in range(n)]
    return picked[1::2] + picked[::2]


def run_steps(decoder_step, memory: np.ndarray, src: np.ndarray, tgt_in: np.ndarray, m) -> np.ndarray:
    """(B, T, V) logits of decoder_step fed tgt_in one token at a time, its cache output fed back each step."""
    from nanomt.interop.onnx import empty_cache

    b = len(src)
    keys = values = empty_cache(m, b)
    out = []
    for t in range(tgt_in.shape[1]):
        feeds = {"tokens": tgt_in[:, t : t + 1], "memory": memory, "src_mask": src != m.pad_id}
        logits, keys, values = decoder_step.run(None, {**feeds, "past_keys": keys, "past_values": values})
        expected_shape = (m.n_decoder_layers, b, m.n_heads, t + 1, m.d_model // m.n_heads)
        assert keys.shape == values.shape == expected_shape, f"step {t}: the cache is one position longer"
        out.append(logits)
    return np.stack(out, axis=1)


def assert_logits_close(ours: np.ndarray, reference: np.ndarray, what: str) -> None:
    """Within TOL where the reference scores an id; -inf (restrict_output) exactly where it does."""
    scored = np.isfinite(reference)
    assert (np.isfinite(ours) == scored).all(), f"{what}: -inf on other ids"
    diff = float(np.abs(ours[scored] - reference[scored]).max())
    assert diff < TOL, f"{what}: logits differ by {diff}"


@pytest.mark.parametrize("variant", list(ONNX_VARIANTS))
def test_onnx_encoder_is_encode_on_a_padded_batch(variant, exports, test_lines):
    """Sentences of different lengths, extra padding columns and an all-padding row: model.encode's memory, row by
    row the same as each sentence encoded alone, and in any batch order."""
    from nanomt.interop.onnx import sessions

    run, onnx_dir = exports[variant]
    encoder, _ = sessions(onnx_dir)
    ours = Translator.from_checkpoint(run)
    m = ours.cfg.model
    lines = test_lines["src"]
    rows = source_rows(ours, [lines[i] for i in different_lengths(ours, lines)])
    src = padded(rows + [[m.pad_id] * 3], m.pad_id)
    src = np.concatenate([src, np.full((len(src), 2), m.pad_id, dtype=np.int64)], axis=1)  # padding on every row
    (memory,) = encoder.run(None, {"src": src})
    with torch.no_grad():
        reference = ours.model.encode(torch.from_numpy(src)).memory.numpy()
    assert memory.shape == reference.shape
    np.testing.assert_allclose(memory, reference, atol=TOL, rtol=0)
    for i, row in enumerate(rows):
        (alone,) = encoder.run(None, {"src": np.array([row], dtype=np.int64)})
        np.testing.assert_allclose(memory[i, : len(row)], alone[0], atol=TOL, rtol=0, err_msg=f"row {i} alone")
    order = np.arange(len(src))[::-1].copy()
    (reordered,) = encoder.run(None, {"src": src[order]})
    np.testing.assert_allclose(reordered, memory[order], atol=TOL, rtol=0)


@pytest.mark.parametrize("variant", list(ONNX_VARIANTS))
def test_onnx_decoder_steps_are_fresh_forwards_on_any_batch(variant, exports, test_lines):
    """Reference targets of different lengths, fed one token at a time with the cache the last step returned: at
    every position each row's logits are a fresh model(src, tgt[:t+1]) forward's last ones; the same sentence pair
    alone, or in the batch reversed, gives the same logits."""
    from nanomt.interop.onnx import sessions

    run, onnx_dir = exports[variant]
    encoder, decoder_step = sessions(onnx_dir)
    ours = Translator.from_checkpoint(run)
    model, m = ours.model, ours.cfg.model
    pick = different_lengths(ours, test_lines["src"])
    rows = source_rows(ours, [test_lines["src"][i] for i in pick])
    targets = ours.tokenizer.encode_tgt([test_lines["tgt"][i] for i in pick])
    targets = [([m.bos_id] + t)[: m.max_positions] for t in targets]  # the decoder's inputs: BOS + reference
    assert len({len(t) for t in targets}) > 2
    src, tgt_in = padded(rows, m.pad_id), padded(targets, m.pad_id)
    (memory,) = encoder.run(None, {"src": src})
    logits = run_steps(decoder_step, memory, src, tgt_in, m)

    with torch.no_grad():
        for t in range(tgt_in.shape[1]):
            fresh = model(torch.from_numpy(src), torch.from_numpy(tgt_in[:, : t + 1]))[:, -1].numpy()  # (B, V)
            live = [i for i, target in enumerate(targets) if t < len(target)]  # rows still reading real tokens
            assert_logits_close(logits[live, t], fresh[live], f"step {t}")

    for i in (int(np.argmin([len(r) for r in rows])), int(np.argmax([len(r) for r in rows]))):
        alone_src, alone_tgt = np.array([rows[i]]), np.array([targets[i]])
        (alone_memory,) = encoder.run(None, {"src": alone_src})
        alone = run_steps(decoder_step, alone_memory, alone_src, alone_tgt, m)
        assert_logits_close(alone[0], logits[i, : len(targets[i])], f"row {i} alone")
    order = np.arange(len(src))[::-1].copy()
    reordered = run_steps(decoder_step, memory[order], src[order], tgt_in[order], m)
    for j, i in enumerate(order):
        assert_logits_close(reordered[j, : len(targets[i])], logits[i, : len(targets[i])], f"row {i} reordered")


@pytest.mark.parametrize("variant", list(ONNX_VARIANTS))
def test_onnx_greedy_is_the_translators_greedy(variant, exports, test_lines):
    """The export's greedy loop gives Translator's greedy tokens (beam 1; the checkpoint's max_len and min_len, then
    a later EOS and a tighter budget) for every sentence, in one padded batch, in reverse order, or alone."""
    from nanomt.interop.onnx import greedy, sessions

    run, onnx_dir = exports[variant]
    encoder, decoder_step = sessions(onnx_dir)
    ours = Translator.from_checkpoint(run)
    m = ours.cfg.model
    sentences = test_lines["src"][:40]
    rows = source_rows(ours, sentences)
    everything = list(range(len(rows)))
    greedy_1 = ours.default_decoding.replace(beam_size=1)
    first = [h[0].tokens for h in ours.translate_hypotheses(sentences, greedy_1)]
    median = sorted(map(len, first))[len(first) // 2]  # settings that bite on about half the sentences:
    later_eos, tighter = greedy_1.replace(min_len=median + 1), greedy_1.replace(max_len_a=0.0, max_len_b=median)
    for decoding in (greedy_1, later_eos, tighter):
        expected = [h[0].tokens for h in ours.translate_hypotheses(sentences, decoding)]
        assert len(set(map(tuple, expected))) > 10  # not one sentence for everything
        assert decoding is greedy_1 or expected != first, f"{decoding} changes no translation: it proves nothing"
        max_lens = [decoding.max_len(len(r) - 1, m.max_positions) for r in rows]

        def onnx_greedy(idx: list[int], decoding=decoding, max_lens=max_lens) -> list[list[int]]:
            src = padded([rows[i] for i in idx], m.pad_id)
            return greedy(encoder, decoder_step, src, m, [max_lens[i] for i in idx], decoding.min_len)

        assert onnx_greedy(everything) == expected, decoding
        assert onnx_greedy(everything[::-1]) == expected[::-1], decoding
        for i in range(0, len(rows), 8):
            assert onnx_greedy([i]) == [expected[i]], f"{decoding}: sentence {i} alone"
