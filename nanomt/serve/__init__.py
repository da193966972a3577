"""The server: nanomt's API and LibreTranslate's over one or more models (one a language pair), with batching.

settings.py holds the settings (ServeConfig), models.py the models and their routing, app.py the app factory and
the decoding queue, api.py nanomt's API, libretranslate.py LibreTranslate's, metrics.py and errors.py the rest.

The names below are imported when first used, so that `nanomt.serve.settings` (the `nanomt serve` flags) imports
without FastAPI, which is an extra: `pip install 'nanomt[serve]'`.
"""

from nanomt.core.lazy import lazy_names

# Each public name and the module it lives in.
_PUBLIC = {
    "ModelSet": "nanomt.serve.models",
    "ModelSpec": "nanomt.serve.settings",
    "ServeConfig": "nanomt.serve.settings",
    "create_app": "nanomt.serve.app",
    "serve": "nanomt.serve.run",
}
__all__ = sorted(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
