"""Other toolkits' checkpoints in (Hugging Face Marian) as nanomt run directories."""

from nanomt.interop.marian import MarianImportError, import_marian

__all__ = ["MarianImportError", "import_marian"]
