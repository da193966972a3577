"""Other toolkits' checkpoints in (Hugging Face Marian) as nanomt run directories, and ours out (CTranslate2, ONNX,
Hugging Face Marian, Argos Translate packages)."""

from nanomt.interop.argos import ArgosExportError, export_argos
from nanomt.interop.ct2 import Ct2ExportError, Ct2Translator, export_ct2
from nanomt.interop.marian import MarianImportError, import_marian
from nanomt.interop.marian_export import MarianExportError, export_marian
from nanomt.interop.onnx import export_onnx

__all__ = [
    "ArgosExportError",
    "Ct2ExportError",
    "Ct2Translator",
    "MarianExportError",
    "MarianImportError",
    "export_argos",
    "export_ct2",
    "export_marian",
    "export_onnx",
    "import_marian",
]
