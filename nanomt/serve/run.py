"""`nanomt serve`: load the models a ServeConfig names and serve them with uvicorn until SIGTERM or Ctrl-C."""

from __future__ import annotations

import dataclasses
import os

from nanomt.core import runtime
from nanomt.serve.app import create_app
from nanomt.serve.metrics import json_logs
from nanomt.serve.models import ModelSet
from nanomt.serve.settings import ServeConfig
from nanomt.serve.store import open_store


def serve(config: ServeConfig) -> None:
    """Serve config.models; SIGTERM or Ctrl-C stops accepting, answers what came in, exits."""
    import uvicorn

    # Secrets kept off the command line, where other users of the machine can read them.
    from_environment = {"api_key": "NANOMT_API_KEY", "store": "NANOMT_STORE", "metrics_key": "NANOMT_METRICS_KEY"}
    given = {f: os.environ[v] for f, v in from_environment.items() if getattr(config, f) is None and os.environ.get(v)}
    config = dataclasses.replace(config, **given)
    store = open_store(config.store)  # unreachable or corrupted: a one-line error naming it, before any loading
    models = ModelSet.read(config.models, config.pivot, config.max_loaded, config.device, config.int8)
    if config.max_loaded is None or config.max_loaded >= len(models.models):
        for model in models.models:  # everything fits: loaded now, so the first request does not wait
            models.translator(model)
    # As `nanomt translate` does (nanomt/cli/models.py): decoding's large blocks kept in the heap.
    if config.device.startswith("cpu"):
        runtime.keep_freed_memory()
    app = create_app(models, config, store)
    json_logs(config.access_log)
    uvicorn.run(
        app, host=config.host, port=config.port, log_level="info", access_log=False,
        timeout_graceful_shutdown=config.grace_seconds,
        proxy_headers=False,  # X-Forwarded-For is read by the server itself, from --forwarded-allow-ips only
    )  # fmt: skip
