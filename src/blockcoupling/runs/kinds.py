"""The registry of collection kinds: what a kind of "many runs" directory adds to the one
collection format (`blockcoupling.store.collection`).

A kind is a package under ``blockcoupling/studies/`` (`KIND_HOME`) whose ``kind.py`` makes one
call, ``register(CollectionKind(...))``: its name (the manifest's ``kind``), its spec's
parser, plan and run, its report page, its headline token rule, its repair line and unit
check, the conversion of an old layout and the loose outputs it recognises. One kind is the
``default`` (a spec without ``kind:``, a manifest that records none). Generic modules ask the
registry and name no kind (docs/DESIGN.md, "Recipe: add a collection kind").
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockcoupling.errors import RunDirError

#: where kind packages live: every sub-package of it with a `KIND_MODULE` registers a kind.
#: The registry finds them by this name when first asked (plugin discovery, as an entry
#: point group would): this layer imports nothing of the studies standing on it.
KIND_HOME = "blockcoupling.studies"
#: a kind package's module that registers it (``blockcoupling.studies.<package>.kind``)
KIND_MODULE = "kind"


@dataclass(frozen=True)
class CollectionKind:
    """One kind of collection. Only ``name``, ``page`` and ``repair`` are required; a kind
    that is not written from a spec file (the monitor: training code writes it) leaves
    ``parse_spec``/``plan``/``run`` None."""

    name: str
    #: the page of an opened collection of this kind -> the HTML file written
    page: Callable[[Any, Path], Path]
    #: the one line that measures a damaged unit of the collection in ``root`` again
    repair: Callable[[Path], str]
    #: a spec mapping (YAML) -> the kind's parsed spec (None: not written from a spec)
    parse_spec: Callable[[Any], Any] | None = None
    #: the ``--dry-run`` plan (a ``runs.plans.StudyPlan``) of a spec (a file or a mapping)
    plan: Callable[..., Any] | None = None
    #: run a spec (a file or a mapping) into a directory: ``run(spec, out, *, executor,
    #: address, resume, progress, cluster_cpus, retries, connect_timeout)`` -> the opened
    #: collection (``blockcoupling sweep`` prints its units): the keywords of
    #: ``runs.protocol.run_collection``, which a kind's run is one call of; a kind whose
    #: command module registers its own command-line run (``cli.app.spec_runner``) may
    #: leave it None
    run: Callable[..., Any] | None = None
    #: the token rule of the headline statistic of a collection of this kind whose manifest
    #: states none (a ViT's [CLS]: "first"; None: the statistic's own default,
    #: ``engine.statistic.DEFAULT_TOKENS``, the paper's last token); every reader of a
    #: collection (sweep-status, report, correlate, coupling_statistic) takes it through
    #: `collection_tokens`
    headline_tokens: str | None = None
    #: why a done unit's folder beyond its run directory cannot be trusted, or None
    unit_check: Callable[[Path], str | None] | None = None
    #: convert an old layout in ``root`` (no manifest yet) into this kind; False: not one
    upgrade: Callable[[Path], bool] | None = None
    #: keys of a spec file that only this kind has (a spec without ``kind:`` naming them
    #: gets the line that asks for ``kind: <name>``)
    spec_keys: tuple[str, ...] = ()
    #: the kind of a spec without ``kind:`` and of a manifest that records none (format 1);
    #: exactly one registered kind is the default
    default: bool = False
    #: whether a folder that is no collection holds this kind's loose outputs (a folder of
    #: ``vit-train`` runs); ``blockcoupling report FOLDER`` then writes ``folder_page``
    recognises: Callable[[Path], bool] | None = None
    #: the page of such a folder -> the HTML file written (``folder_page(folder, out)``)
    folder_page: Callable[[Path, Path], Path] | None = None
    #: the package the kind lives in (its ``kind.py`` passes ``package=__package__``): the
    #: architecture test holds the kind's name and imports to it
    package: str = ""


_KINDS: dict[str, CollectionKind] = {}
_loaded = False


def register(kind: CollectionKind) -> CollectionKind:
    """Add ``kind`` (its name must be new, or the same object registered again)."""
    old = _KINDS.get(kind.name)
    if old is not None and old is not kind:
        raise ValueError(f"collection kind {kind.name!r} is registered twice")
    other = next((k.name for k in _KINDS.values() if k.default and k.name != kind.name), None)
    if kind.default and other is not None:
        raise ValueError(f"collection kind {kind.name!r} is a default, but {other!r} is "
                         "already the default kind")
    if (kind.recognises is None) != (kind.folder_page is None):
        raise ValueError(f"collection kind {kind.name!r}: give both recognises and "
                         "folder_page, or neither")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Remove a kind (tests that register a kind of their own)."""
    _KINDS.pop(name, None)


def load_kinds() -> None:
    """Import every kind package's ``kind`` module once (each registers its kind)."""
    global _loaded
    if _loaded:
        return
    home = importlib.util.find_spec(KIND_HOME)
    folders = list(home.submodule_search_locations or []) if home is not None else []
    for info in pkgutil.iter_modules(folders):
        name = f"{KIND_HOME}.{info.name}.{KIND_MODULE}"
        if info.ispkg and importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    _loaded = True


def names() -> tuple[str, ...]:
    """The registered kinds' names, sorted."""
    load_kinds()
    return tuple(sorted(_KINDS))


def get(name: str, where: str | Path = "collection") -> CollectionKind:
    """The kind called ``name``, or one `RunDirError` line naming the known kinds."""
    load_kinds()
    kind = _KINDS.get(name)
    if kind is None:
        raise RunDirError(f"{where}: unknown collection kind {name!r} (known: "
                          f"{', '.join(sorted(_KINDS))}); it was written by another "
                          "blockcoupling: upgrade blockcoupling to read it")
    return kind


def spec_kinds() -> tuple[str, ...]:
    """The kinds a spec file may ask for (those with a spec parser)."""
    return tuple(n for n in names() if _KINDS[n].parse_spec is not None)


def default() -> CollectionKind:
    """The default kind (``CollectionKind.default``): that of a spec without ``kind:`` and of
    a manifest that records none."""
    load_kinds()
    found = [k for k in _KINDS.values() if k.default]
    if len(found) != 1:  # a broken installation, not a user's input
        raise RuntimeError(f"{len(found)} collection kinds are marked default; one must be")
    return found[0]


def manifest_kind(manifest: Mapping[str, Any]) -> str:
    """The kind a collection manifest (``store.collection.load_manifest``) records; one that
    records none (format 1, written when there was one kind) is the `default` kind's."""
    kind = manifest.get("kind")
    return default().name if kind is None else str(kind)


def collection_tokens(manifest: Mapping[str, Any]) -> str:
    """The token rule of a collection's headline statistic: the rule its manifest states
    (``headline_tokens``: a ViT grid writes its ``--tokens``), else its kind's
    (`CollectionKind.headline_tokens`), else the statistic's default. The one token default
    of every command that reads a collection."""
    from blockcoupling.engine.statistic import DEFAULT_TOKENS, headline_tokens

    own = get(manifest_kind(manifest)).headline_tokens
    return headline_tokens(manifest, default=own or DEFAULT_TOKENS)


def recognising(path: Path) -> CollectionKind | None:
    """The kind whose ``recognises`` takes the folder ``path`` (which is no collection) as
    its loose outputs, or None."""
    for name in names():
        recognises = _KINDS[name].recognises
        if recognises is not None and recognises(path):
            return _KINDS[name]
    return None
