"""The server: nanomt's API and LibreTranslate's over one or more models (one a language pair), with batching.

settings.py holds the settings (ServeConfig), models.py the models and their routing, app.py the app factory and
the decoding queue, api.py nanomt's API, libretranslate.py LibreTranslate's, metrics.py and errors.py the rest.
"""

from nanomt.serve.app import create_app
from nanomt.serve.models import ModelSet
from nanomt.serve.run import serve
from nanomt.serve.settings import ModelSpec, ServeConfig

__all__ = ["ModelSet", "ModelSpec", "ServeConfig", "create_app", "serve"]
