"""Other toolkits' checkpoints in (Hugging Face Marian) as nanomt run directories, and ours out (CTranslate2, ONNX,
Hugging Face Marian, Argos Translate packages).

The names load with their module when first used: the CTranslate2 side (`ct2`, `argos`) runs without torch.
"""

from nanomt.core.lazy import lazy_names

_PUBLIC = {
    "ArgosExportError": "nanomt.interop.argos",
    "export_argos": "nanomt.interop.argos",
    "Ct2ExportError": "nanomt.interop.ct2",
    "Ct2Translator": "nanomt.interop.ct2",
    "export_ct2": "nanomt.interop.ct2",
    "MarianImportError": "nanomt.interop.marian",
    "import_marian": "nanomt.interop.marian",
    "MarianExportError": "nanomt.interop.marian_export",
    "export_marian": "nanomt.interop.marian_export",
    "export_onnx": "nanomt.interop.onnx",
}
__all__ = sorted(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
