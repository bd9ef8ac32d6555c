"""Lazy re-exports (PEP 562): a package's public names imported on first attribute access.

Bottom layer (imports nothing of the package): ``blockcoupling`` and ``blockcoupling.studies``
both resolve their exports here, so ``import blockcoupling`` (and ``blockcoupling --help``)
load no torch, pandas or ray until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any


def resolve(namespace: MutableMapping[str, Any], package: str, where: Mapping[str, str],
            name: str) -> Any:
    """``name`` from its module ``where[name]``, cached in the package's ``namespace`` (later
    look-ups skip ``__getattr__``); AttributeError for a name the package does not export."""
    module = where.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value


def listing(namespace: Mapping[str, Any], exported: Iterable[str]) -> list[str]:
    """The package's ``__dir__``: what it holds and what it exports."""
    return sorted(set(namespace) | set(exported))


def hooks(namespace: MutableMapping[str, Any], package: str,
          exports: Mapping[str, Iterable[str]]
          ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) for ``exports`` (module -> the
    names it exports): ``__getattr__, __dir__ = lazy.hooks(globals(), __name__, EXPORTS)``."""
    where = {name: module for module, names in exports.items() for name in names}

    def getattr_(name: str) -> Any:
        return resolve(namespace, package, where, name)

    def dir_() -> list[str]:
        return listing(namespace, namespace.get("__all__", where))

    return getattr_, dir_


__all__ = ["hooks", "listing", "resolve"]
