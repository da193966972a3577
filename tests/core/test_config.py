"""Config loading: YAML round trip, overrides with type checking, unknown keys named with their section."""

import pytest
import yaml

from nanomt.core.config import Config, ConfigError, ModelConfig, config_from_dict, load_config, save_config


def test_yaml_round_trip(tmp_path):
    cfg = config_from_dict(
        {"model": {"d_model": 64, "n_heads": 4}, "data": {"train": {"src": "a.de", "tgt": "a.en"}}},
        ["train.betas=[0.9, 0.99]"],
    )
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert again == cfg
    assert again.train.betas == (0.9, 0.99)
    assert again.data.train.src == "a.de"


def test_vocab_defaults_to_data_vocab_size():
    cfg = config_from_dict({"data": {"vocab_size": 123}, "model": {"d_model": 32, "n_heads": 2}})
    assert cfg.model.src_vocab_size == cfg.model.tgt_vocab_size == 123


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"model": {"d_modle": 3}}, ["d_modle", "model"]),
        ({"train": {"warmup": 3}}, ["warmup", "train"]),
        ({"data": {"train": {"source": "x"}}}, ["source", "data.train"]),
        ({"optim": {}}, ["optim", "top level"]),
    ],
)
def test_unknown_key_names_key_and_section(raw, words):
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.max_steps=ten", ["train.max_steps", "int", "ten"]),
        ("train.lr=fast", ["train.lr", "float"]),
        ("train.precision=fp8", ["train.precision", "fp8"]),
        ("model.norm_first=3", ["model.norm_first", "bool"]),
        ("train.betas=[0.9]", ["train.betas"]),
        ("train.nope=1", ["nope", "train"]),
        ("train.max_steps", ["section.key=value"]),
    ],
)
def test_override_type_checking(override, words):
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, [override])
    for w in words:
        assert w in str(e.value)


def test_overrides_apply_with_types():
    cfg = config_from_dict(
        {},
        [
            "train.max_steps=10",
            "train.lr=0.002",
            "model.norm_first=false",
            "data.valid.tsv=v.tsv",
            "train.valid_bleu_sentences=null",
            "train.max_minutes=1",
        ],
    )
    assert cfg.train.max_steps == 10 and cfg.train.lr == 0.002
    assert cfg.model.norm_first is False
    assert cfg.data.valid.tsv == "v.tsv"
    assert cfg.train.valid_bleu_sentences is None
    assert cfg.train.max_minutes == 1.0 and isinstance(cfg.train.max_minutes, float)


def test_model_validation_surfaces_as_config_error():
    with pytest.raises(ConfigError, match="n_heads"):
        config_from_dict({"model": {"d_model": 30, "n_heads": 4}})


@pytest.mark.parametrize(
    "data, words",
    [
        ({"bpe_dropout": 1.0}, "bpe_dropout must be in"),
        ({"bpe_dropout": 0.1, "tokenizer": "unigram"}, "needs tokenizer"),
        ({"max_len": 0}, "max_len must be >= 1, got 0"),
    ],
)
def test_data_settings_that_cannot_be_are_refused(data, words):
    with pytest.raises(ConfigError, match=words):
        config_from_dict({"data": data})


@pytest.mark.parametrize(
    "train, words",
    [
        ({"eval_every": 0}, "eval_every must be >= 1, got 0"),
        ({"save_every": 0}, "save_every must be >= 1, got 0"),
        ({"log_every": 0}, "log_every must be >= 1, got 0"),
        ({"accum_steps": 0}, "accum_steps must be >= 1, got 0"),
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"warmup_steps": -1}, "warmup_steps must be >= 0, got -1"),
        ({"clip_norm": -1.0}, "clip_norm must be >= 0, got -1.0"),
        ({"lr": 0.0}, "lr must be > 0, got 0.0"),
        ({"max_minutes": -5.0}, "max_minutes must be > 0, got -5.0"),
        ({"label_smoothing": 1.5}, "label_smoothing must be in [0, 1), got 1.5"),
        ({"betas": [0.9, 1.0]}, "betas must be in [0, 1), got (0.9, 1.0)"),
        ({"num_threads": 0}, "num_threads must be >= 1, got 0"),
    ],
)
def test_training_numbers_out_of_range_are_refused_when_the_config_loads(train, words):
    """Each was a ZeroDivisionError, an UnboundLocalError, or a run that trained on it (a negative clip_norm
    turned every step into gradient ascent)."""
    with pytest.raises(ConfigError) as e:
        config_from_dict({"train": train})
    assert words in str(e.value) and "\n" not in str(e.value)
    config_from_dict({"train": {"warmup_steps": 0, "clip_norm": 0.0, "keep_last": 0, "valid_bleu_sentences": 0}})


def test_configs_are_frozen():
    cfg = Config(model=ModelConfig(10, 10, d_model=8, n_heads=2))
    with pytest.raises(AttributeError):
        cfg.model.d_model = 16


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


def test_shipped_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent.parent / "configs"
    files = sorted(root.glob("*.yaml"))
    assert files, "no configs shipped"
    for f in files:
        load_config(f)


@pytest.mark.parametrize(
    "raw, words",
    [
        (
            {"data": {"bpe_dropout": 0.1, "shared_vocab": True}, "model": {"restrict_output": True}},
            ["restrict_output needs data.bpe_dropout"],
        ),
        ({"data": {"shared_vocab": False}, "train": {"bidirectional_epochs": 1}}, ["needs data.shared_vocab"]),
        (
            {"model": {"restrict_output": True}, "train": {"bidirectional_epochs": 1, "accum_steps": 2}},
            ["needs train.accum_steps: 1"],
        ),
    ],
)
def test_options_that_do_not_combine_are_rejected_when_the_config_loads(tmp_path, raw, words):
    raw["model"] = {"d_model": 32, "n_heads": 2, **raw.get("model", {})}
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=words[0]):
        load_config(path)


def test_numbers_as_people_write_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 5e-4\n  eps: 1E-9\n  max_minutes: 1_000.5\n")
    cfg = load_config(path, ["train.label_smoothing=2e-1"])
    assert (cfg.train.lr, cfg.train.eps, cfg.train.max_minutes) == (5e-4, 1e-9, 1000.5)
    assert cfg.train.label_smoothing == 0.2
    with pytest.raises(ConfigError, match="train.lr"):
        config_from_dict({}, ["train.lr=fast"])


def test_invalid_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  d_model: 64\n  n_heads: [4\ntrain:\n  lr: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert str(path) in message and "line " in message and "invalid YAML" in message and "\n" not in message


def test_keys_of_removed_options_are_unknown_keys():
    """No compatibility for versions never released: a removed option is an unknown key like any other."""
    for section in ({"dropout_start": None}, {"dropout_ramp": 0.5}):
        with pytest.raises(ConfigError, match=f"unknown config key {next(iter(section))!r} in section 'train'"):
            config_from_dict({"train": section})


def test_negative_bidirectional_epochs_is_a_config_error():
    with pytest.raises(ConfigError, match="bidirectional_epochs"):
        config_from_dict({"train": {"bidirectional_epochs": -1}})
