"""`python -m nanomt.cli`: the `nanomt` command."""

from nanomt.cli import main

main()
