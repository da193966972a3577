"""Other toolkits' checkpoints in (Hugging Face Marian) as nanomt run directories, and ours out (CTranslate2, ONNX,
Hugging Face Marian, Argos Translate packages).

The names load with their module when first used: the CTranslate2 side (`ct2`, `argos`) runs without torch.
"""

import importlib

_MODULES = {
    "ArgosExportError": "argos",
    "export_argos": "argos",
    "Ct2ExportError": "ct2",
    "Ct2Translator": "ct2",
    "export_ct2": "ct2",
    "MarianImportError": "marian",
    "import_marian": "marian",
    "MarianExportError": "marian_export",
    "export_marian": "marian_export",
    "export_onnx": "onnx",
}
__all__ = sorted(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module 'nanomt.interop' has no attribute {name!r}")
    return getattr(importlib.import_module(f"nanomt.interop.{_MODULES[name]}"), name)
