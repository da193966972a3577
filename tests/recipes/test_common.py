"""scripts/common.py's paths as results files name them."""

import os

from scripts.common import ROOT, relative_paths, shown


def test_a_path_is_named_as_it_was_reached_not_through_its_links(tmp_path):
    """A checkout whose ../shared is a link (a worktree beside a linked data folder) names the data ../shared/...,
    never the link's target on this machine."""
    (tmp_path / "real" / "data").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    through_link = tmp_path / "link" / "data"
    assert shown(through_link) == os.path.relpath(through_link, ROOT)
    assert "real" not in shown(through_link)
    assert relative_paths({"data": [str(through_link)], "n": 3}) == {"data": [shown(through_link)], "n": 3}
    assert shown(ROOT / "scripts" / ".." / "README.md") == "README.md"
