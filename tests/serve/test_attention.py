"""/attention decodes with the beam it is asked for, else the server's default beam, and gives the Translator's
attention for it (translation, tokens and cross-attention)."""

from __future__ import annotations

import flag_run
import numpy as np
import pytest
from flag_run import rounded_cross, with_decode

from nanomt.decoding.translate import Translator

run_dir = flag_run.run_dir  # flag_run's fixture, this module's too

pytestmark = pytest.mark.usefixtures("one_thread")


def test_attention_decodes_with_the_beam_asked_for_else_the_servers_default(run_dir, toy_corpus, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from nanomt.serve import create_app

    # The checkpoint's own beam is 1, the server's default 2: a request without beam_size gets 2.
    translator = Translator.from_checkpoint(with_decode(run_dir, tmp_path / "beam1", beam_size=1))
    sentences = toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()[:30]
    three_ways = (
        s for s in sentences if len({translator.attention(s, beam_size=b).translation for b in (1, 2, 3)}) == 3
    )
    text = next(three_ways, None)
    assert text is not None, "no sentence that beams 1, 2 and 3 translate three ways"
    with TestClient(create_app(translator, default_beam=2)) as c:
        for beam in (1, 3, None):
            res = c.post("/attention", json={"text": text} if beam is None else {"text": text, "beam_size": beam})
            assert res.status_code == 200, res.text
            body, att = res.json(), translator.attention(text, beam_size=beam or 2)
            assert (body["translation"], body["src_tokens"], body["tgt_tokens"]) == (
                att.translation,
                att.src_tokens,
                att.tgt_tokens,
            ), beam
            np.testing.assert_array_equal(np.array(body["cross_attention"]), rounded_cross(att))
