"""The tiny run (30 steps) that the server's batching tests (serve/test_batching.py) and the test of `nanomt serve`'s
flags (cli/test_serve_flags.py) serve."""

import pytest
from conftest import tiny_config


@pytest.fixture(scope="module")
def run_dir(toy_corpus, trained):
    return trained(tiny_config(toy_corpus, max_steps=30, eval_every=30, save_every=30))
