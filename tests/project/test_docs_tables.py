"""The docs' tables of decoding settings are what `make docs` writes from the settings' fields."""

from scripts import docs


def test_the_decoding_tables_are_written_from_the_settings():
    stale = [str(p.relative_to(docs.ROOT)) for p in docs.outdated()]
    assert stale == [], f"{stale}: out of date; run make docs"


def test_the_decode_table_has_a_row_a_config_key_with_its_bounds():
    rows = docs.config_rows()
    assert rows[2].startswith("| `beam_size` | int | `5` | beam width") and "(must be >= 1)" in rows[2]
    assert any(r.startswith("| `max_tokens` | int | `4096` |") for r in rows)
