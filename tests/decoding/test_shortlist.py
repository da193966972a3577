"""The vocabulary shortlist: its table against a brute-force count, decoding over it against a search of the whole
model with the other ids masked, nothing changed when it is off, and `nanomt shortlist` / `--shortlist` / the API."""

import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import decoding, random_src, random_transformer, run_nanomt, tiny_config
from decode_golden import restricted_transformer

from nanomt.decoding import shortlist as sl
from nanomt.decoding.quantize import quantize_int8
from nanomt.decoding.search import search
from nanomt.decoding.translate import Translator


def brute_force(src, tgt, vocab, top, frequent):
    """The table by counting in plain Python."""
    s_count, t_count, pair = Counter(), Counter(), Counter()
    for s, t in zip(src, tgt):
        s_count.update(set(s))
        t_count.update(set(t))
        pair.update((a, b) for a in set(s) for b in set(t))
    table = {}
    for a in s_count:
        scored = [(-2 * pair[a, b] / (s_count[a] + t_count[b]), b) for b in t_count if pair[a, b]]
        table[a] = tuple(b for _, b in sorted(scored)[:top])
    common = tuple(b for _, b in sorted((-c, b) for b, c in t_count.items())[:frequent])
    return table, common


def test_the_table_is_the_dice_ranking_of_a_brute_force_count():
    g = torch.Generator().manual_seed(0)
    src = [
        torch.randint(4, 30, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(300)
    ]
    tgt = [[x + 10 for x in s[: len(s) // 2 + 1]] + torch.randint(4, 40, (2,), generator=g).tolist() for s in src]
    built = sl.build(src, tgt, 60, "fp", top=5, frequent=7)
    table, common = brute_force(src, tgt, 60, 5, 7)
    assert built.table == table and built.frequent == common
    # the pair a source id was built to predict (s -> s + 10) is ranked first for most ids
    assert sum(built.table[s][0] == s + 10 for s in built.table) > 0.8 * len(built.table)
    assert built.allowed([[4, 5]], [3]) == sorted(set(table[4]) | set(table[5]) | set(common) | {3})


def masked_greedy(model, src, allowed, max_len):
    """Greedy decoding of the whole model, recomputed from scratch each step, with every other id's logit -inf."""
    out = []
    for row in src:
        tokens = [model.cfg.bos_id]
        src_row = row[row != model.cfg.pad_id].unsqueeze(0)
        for _ in range(max_len):
            logits = model(src_row, torch.tensor([tokens]))[0, -1].float()
            mask = torch.full_like(logits, float("-inf"))
            mask[allowed] = 0
            mask[[model.cfg.pad_id, model.cfg.bos_id]] = float("-inf")
            nxt = int((logits + mask).argmax())
            if nxt == model.cfg.eos_id:
                break
            tokens.append(nxt)
        out.append(tokens[1:])
    return out


@pytest.mark.parametrize("restricted", [False, True])
def test_decoding_over_a_shortlist_is_the_whole_models_search_with_the_other_ids_masked(restricted, one_thread):
    model = restricted_transformer(2) if restricted else random_transformer(2, 50)
    src = random_src([6, 3, 8], seed=3, vocab=50)
    allowed = [3, 7, 9, 11, 20, 21, 22, 30, 31, 32, 41]  # EOS and a few others
    view = sl.restrict(model, allowed)
    got = [h[0].tokens for h in search(view, src, decoding(10))]
    kept = [i for i in allowed if not restricted or bool(model.output_mask[i])]
    assert got == masked_greedy(model, src, kept, 10)
    assert all(t in kept for tokens in got for t in tokens)
    # the view shares the model's parameters: nothing copied but the output rows
    assert view.encoder is model.encoder and view.tgt_embed.tokens.weight is model.tgt_embed.tokens.weight
    # every id allowed: the same beam search as the model itself
    everything = list(range(50))
    full = [h[0].tokens for h in search(model, src, decoding(10, beam_size=3))]
    assert [h[0].tokens for h in search(sl.restrict(model, everything), src, decoding(10, beam_size=3))] == full


def test_an_int8_model_restricts_its_int8_rows(one_thread):
    model = quantize_int8(random_transformer(4, 50))
    src = random_src([5, 7], seed=1, vocab=50)
    full = search(model, src, decoding(10, beam_size=2))
    view = sl.restrict(model, list(range(50)))
    assert [h[0].tokens for h in search(view, src, decoding(10, beam_size=2))] == [h[0].tokens for h in full]
    few = sl.restrict(model, [3, 10, 12, 14])
    assert all(t in (10, 12, 14) for h in search(few, src, decoding(10)) for t in h[0].tokens)


@pytest.fixture
def run_dir(toy_corpus, trained, tmp_path_factory):
    """A copy of the tiny run (`nanomt shortlist` writes its table into it)."""
    torch.set_num_threads(1)
    return shutil.copytree(
        trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60)),
        tmp_path_factory.mktemp("shortlist") / "run",
    )


@pytest.mark.slow  # nanomt's commands on a trained run
def test_nanomt_shortlist_and_translate_shortlist(run_dir, toy_corpus, tmp_path):
    src = toy_corpus["test.src"]
    plain = run_nanomt("translate", run_dir, "-i", src, text=True)
    missing = run_nanomt("translate", run_dir, "-i", src, "--shortlist", text=True)
    assert missing.returncode != 0 and "shortlist.json not found" in missing.stderr
    assert missing.stderr.strip().count("\n") == 0
    pairs = ["--src", toy_corpus["train.src"], "--tgt", toy_corpus["train.tgt"]]
    for bad in (["--top", "0"], ["--frequent", "-1"]):  # one line, and no shortlist.json written
        refused = run_nanomt("shortlist", run_dir, *pairs, *bad, text=True)
        assert refused.returncode == 1 and "--top must be >= 1 and --frequent >= 0" in refused.stderr
        assert refused.stderr.strip().count("\n") == 0 and not (run_dir / sl.SHORTLIST).exists()
    run_nanomt("shortlist", run_dir, *pairs, check=True)
    assert (run_dir / sl.SHORTLIST).is_file()
    short = run_nanomt("translate", run_dir, "-i", src, "--shortlist", text=True, check=True)
    again = run_nanomt("translate", run_dir, "-i", src, text=True)
    assert again.stdout == plain.stdout  # a shortlist beside the weights changes nothing until asked for
    assert len(short.stdout.splitlines()) == len(plain.stdout.splitlines())
    t = Translator.from_checkpoint(run_dir)
    lines = src.read_text().splitlines()
    assert short.stdout.splitlines() == t.translate(lines, shortlist=True)
    with pytest.raises(sl.ShortlistError, match="another|not"):
        sl.Shortlist.load(run_dir, "another tokenizer")


@pytest.mark.slow  # a trained toy run and three exports
def test_export_ct2_writes_the_shortlist_as_ctranslate2_s_vocabulary_map(run_dir, toy_corpus, tmp_path):
    """A line per source piece with its target pieces and one with an empty key for the frequent ones; CTranslate2
    reads it (use_vmap) and then produces only pieces that the map allows for the batch."""
    pytest.importorskip("ctranslate2")
    from nanomt.interop.ct2 import VMAP, Ct2Translator, export_ct2, vocabularies

    work = tmp_path / "run"
    shutil.copytree(run_dir, work)
    (work / sl.SHORTLIST).unlink(missing_ok=True)
    assert not (export_ct2(work, tmp_path / "plain") / VMAP).exists()  # no shortlist, no map
    tok = Translator.from_checkpoint(work).tokenizer
    srcs, tgts = (toy_corpus[name].read_text(encoding="utf-8").splitlines() for name in ("train.src", "train.tgt"))
    table = sl.build(tok.encode_src(srcs), tok.encode_tgt(tgts), tok.tgt_vocab_size, tok.fingerprint(), 1, 1)
    table.save(work)
    out = export_ct2(work, tmp_path / "ct2")
    src_vocab, tgt_vocab = vocabularies(work / "tokenizer")
    want = {"": sorted(tgt_vocab[t] for t in table.frequent)}
    want |= {src_vocab[s]: sorted(tgt_vocab[t] for t in ts) for s, ts in table.table.items()}
    got = {}
    for line in (out / VMAP).read_text(encoding="utf-8").splitlines():
        key, _, values = line.partition("\t")
        got[key] = sorted(values.split())
    assert got == want

    # A narrow map (no source rules, three pieces the plain translations do not use): CTranslate2 keeps to it.
    lines = toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()[:8]

    def produced(model_dir: Path, use_vmap: bool) -> set[str]:
        t = Ct2Translator(model_dir, intra_threads=1)
        tokens = [[t.src_vocab[x] for x in ids] for ids in t.encode(lines)]
        results = t.translator.translate_batch(tokens, beam_size=2, max_decoding_length=10, use_vmap=use_vmap)
        return {p for r in results for p in r.hypotheses[0]}

    plain = produced(out, use_vmap=False)
    unused = [i for i in range(4, tok.tgt_vocab_size) if tgt_vocab[i] not in plain][:3]
    sl.Shortlist({}, tuple(unused), tok.fingerprint()).save(work)
    narrow = export_ct2(work, tmp_path / "narrow")
    allowed = {tgt_vocab[i] for i in unused}
    assert plain - allowed and produced(narrow, use_vmap=True) <= allowed
