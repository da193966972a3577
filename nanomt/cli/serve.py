"""`nanomt serve`: the ServeConfig of the flags (one a field, nanomt/cli/parser.py), served until stopped."""

from __future__ import annotations

import argparse

from nanomt.cli import models, no_collection_while_loading, require_extra
from nanomt.cli.parser import settings_from_args
from nanomt.serve.settings import ServeConfig

# What `pip install 'nanomt[serve]'` brings that the server cannot start without.
SERVE_MODULES = ("fastapi", "uvicorn", "prometheus_client")


def serve(args: argparse.Namespace) -> None:
    require_extra("serve", "serve needs FastAPI, uvicorn and prometheus_client", SERVE_MODULES)
    config = settings_from_args(ServeConfig, args)  # its checks before anything is loaded
    with no_collection_while_loading():  # torch, the server's packages
        models.check_device(config.device)
        from nanomt.serve.run import serve as run

    run(config)
