"""Public names of a package imported from their modules when first used, so that importing the package is cheap
(no torch for `nanomt --help`, no FastAPI for the serve flags, no torch for the CTranslate2 side of interop)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_names(package: str, public: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of `package`, whose `public` names map to the modules holding them."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> object:
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(public[name]), name)
        namespace[name] = value  # the next look-up finds it without this function
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *public])

    return __getattr__, __dir__
