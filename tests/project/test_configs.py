"""The shipped configs load; the WMT14 ones train a few steps through the Hugging Face loader on local lines."""

import json

import pytest
import sentencepiece as spm
from conftest import tiny_config
from paths import REPO

from nanomt.core.config import config_from_dict, load_config
from nanomt.core.tokenizer import train_tokenizer
from nanomt.training.synthetic import write_corpus
from nanomt.training.train import train

CONFIGS = REPO / "configs"
WMT14 = ["wmt14_en_de_base.yaml", "wmt14_de_en_base.yaml"]


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_loads(name):
    load_config(CONFIGS / name)


def test_the_wmt14_configs_are_the_papers_base_model():
    for name in WMT14:
        cfg = load_config(CONFIGS / name)
        m, t, d = cfg.model, cfg.train, cfg.decode
        assert (m.d_model, m.n_heads, m.n_encoder_layers, m.n_decoder_layers, m.d_ff) == (512, 8, 6, 6, 2048)
        assert (m.dropout, m.norm_first, m.share_embeddings, cfg.data.shared_vocab) == (0.1, False, True, True)
        assert (t.warmup_steps, t.betas, t.label_smoothing, t.max_steps) == (4000, (0.9, 0.98), 0.1, 100_000)
        assert t.max_tokens * 8 * t.accum_steps == 25_000  # target tokens per update on 8 GPUs
        assert (d.beam_size, d.length_penalty) == (4, 0.6)
    en_de, de_en = (load_config(CONFIGS / n).data.hf for n in WMT14)
    assert (en_de.src_lang, en_de.tgt_lang, de_en.src_lang, de_en.tgt_lang) == ("en", "de", "de", "en")


@pytest.mark.parametrize("name", WMT14)
def test_wmt14_config_trains_on_local_lines_through_the_same_loader(name, tmp_path, hf_cache):
    paths = write_corpus(tmp_path / "toy", pairs=300, seed=0, valid=20, test=20)
    files = {}
    for split, hf_split in (("train", "train"), ("valid", "validation")):
        src, tgt = (paths[f"{split}.{side}"].read_text(encoding="utf-8").splitlines() for side in ("src", "tgt"))
        rows = [{"translation": {"en": s, "de": t}} for s, t in zip(src, tgt)]
        files[hf_split] = tmp_path / f"{hf_split}.jsonl"
        files[hf_split].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    small = {k: v for k, v in tiny_config(paths)["model"].items() if k != "max_positions"}
    overrides = [
        "data.hf.path=json",
        "data.hf.name=null",
        f"data.hf.data_files={{train: {files['train']}, validation: {files['validation']}}}",
        "data.vocab_size=150",
        "data.tokenizer_sentences=200",
        *(f"model.{k}={v}" for k, v in small.items()),
        "train.max_steps=2",
        "train.eval_every=2",
        "train.valid_bleu_sentences=5",
        "train.progress=false",
        "train.num_threads=1",
    ]
    cfg = load_config(CONFIGS / name, overrides)
    run = train(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "valid_bleu" in rows[-1]


def test_the_tokenizer_trains_on_at_most_tokenizer_sentences(toy_corpus, tmp_path, monkeypatch):
    seen = {}
    real = spm.SentencePieceTrainer.train

    def train_spy(**kwargs):
        sentences = list(kwargs.pop("sentence_iterator"))
        seen["sentences"], seen["limit"] = len(sentences), kwargs["input_sentence_size"]
        return real(sentence_iterator=iter(sentences), **kwargs)

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", train_spy)
    cfg = config_from_dict(tiny_config(toy_corpus) | {"data": {"vocab_size": 120, "tokenizer_sentences": 500}})
    lines = toy_corpus["train.src"].read_text(encoding="utf-8").splitlines()
    train_tokenizer(lines, lines, tmp_path / "tok", cfg.data)
    assert seen == {"sentences": 2 * len(lines), "limit": 500}  # all streamed past, 500 kept by the sampler
