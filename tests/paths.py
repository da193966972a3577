"""Where the tests find the repository and their data, whichever folder of tests/ a test file is in."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent  # the repository root: nanomt/, configs/, docs/, scripts/, benchmarks/, README.md
DATA = TESTS / "data"  # the committed samples the tests read (data/README.md says what each is)
