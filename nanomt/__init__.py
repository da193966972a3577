"""nanomt: the original Transformer for machine translation, from scratch in PyTorch.

The public names are imported when first used (`nanomt.Translator`, `from nanomt import ModelConfig`): importing
nanomt itself imports no torch, so that `nanomt --help` and the torch-free tools (a CTranslate2 worker) start fast.
"""

import os

from nanomt.core.lazy import lazy_names

# oneDNN, which runs bf16 matmuls on the CPU, JIT-compiles a kernel for each matrix shape and caches 1,024 of
# them. Length-bucketed batches bring ~160 shapes an epoch and dozens of kernels each, so the default cache
# thrashes and steps recompile their kernels every epoch: 1.38x on a Multi30k bf16 step (docs/performance.md).
# oneDNN reads this when it makes its first kernel, so it is set here, before any nanomt module imports torch;
# setdefault leaves a user's own setting alone.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "65536")

__version__ = "0.1.0"

# Each public name and the module it lives in.
_PUBLIC = {
    "Config": "nanomt.core.config",
    "DataConfig": "nanomt.core.config",
    "DecodeConfig": "nanomt.core.config",
    "ModelConfig": "nanomt.core.config",
    "TrainConfig": "nanomt.core.config",
    "load_config": "nanomt.core.config",
    "Decoding": "nanomt.core.decoding",
    "Sampling": "nanomt.core.decoding",
    "Transformer": "nanomt.core.model",
    "Translator": "nanomt.decoding.translate",
}
__all__ = sorted(_PUBLIC)


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
