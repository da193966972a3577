"""nanomt: the original Transformer for machine translation, from scratch in PyTorch."""

# First: runtime sets oneDNN's kernel cache size, which must happen before torch makes its first kernel.
import nanomt.core.runtime  # noqa: F401  # isort: skip
from nanomt.core.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig, load_config
from nanomt.core.model import Transformer

__version__ = "0.1.0"
__all__ = [
    "Config",
    "DataConfig",
    "DecodeConfig",
    "ModelConfig",
    "TrainConfig",
    "Transformer",
    "Translator",
    "load_config",
]


def __getattr__(name: str):
    # Translator pulls in the tokenizer and data pipeline; import it only when asked for.
    if name == "Translator":
        from nanomt.decoding.translate import Translator

        return Translator
    raise AttributeError(f"module 'nanomt' has no attribute {name!r}")
