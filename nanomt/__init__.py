"""nanomt: the original Transformer for machine translation, from scratch in PyTorch."""

import os

# oneDNN, which runs bf16 matmuls on the CPU, JIT-compiles a kernel for each matrix shape and caches 1,024 of
# them. Length-bucketed batches bring ~160 shapes an epoch and dozens of kernels each, so the default cache
# thrashes and steps recompile their kernels every epoch: 1.38x on a Multi30k bf16 step (benchmarks/README.md).
# oneDNN reads this when it makes its first kernel; setdefault leaves a user's own setting alone.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "65536")

from nanomt.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig, load_config
from nanomt.model import Transformer

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
        from nanomt.translate import Translator

        return Translator
    raise AttributeError(f"module 'nanomt' has no attribute {name!r}")
