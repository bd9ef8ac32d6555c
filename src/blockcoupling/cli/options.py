"""Commands whose options are generated from a config record's fields (``blockcoupling.fields``).

``measure`` takes one option per exposed [`MeasureConfig`][blockcoupling.engine.config.MeasureConfig]
field and one per [`ModelSource`][blockcoupling.loading.ModelSource] field (its loading
options; ``perturb`` a part of them), ``vit-train`` and ``vit-grid`` one per
[`VitTrainConfig`][blockcoupling.studies.vit.train.VitTrainConfig] field: the flag, the help
and the default come from the record, never restated here.

The options are added the first time a command's parameters are needed (parsing its
arguments or printing its help), not at import: the records' modules import torch, and
``blockcoupling --help`` or another command must not pay for it. The values given reach the
command through the click context: `given_options` (field -> value, options not given
left out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperCommand

_KEY = "blockcoupling.config_options"
_SEP = "__"  # click parameter names of generated options: GROUP__FIELD (a field may share a
#             command's name, or another record's: MeasureConfig's and ModelSource's dtype)


def record_command(load: Callable[[], list[Any]] | None = None,
                   **groups: Callable[[], list[Any]]) -> type[TyperCommand]:
    """A command class that adds the options ``load()`` returns (``fields.OptionSpec`` list;
    the group ``config``) and those of each of ``groups`` (group name -> its loader, e.g.
    ``source=`` a `ModelSource`'s) to the command's own, in that order; `given_options`
    reads them back by group."""
    loads = dict(groups) | ({"config": load} if load is not None else {})

    class RecordCommand(TyperCommand):
        _added = False

        def _load(self) -> None:
            if self._added:
                return
            import inspect

            from blockcoupling.fields import option_parameters

            params = [p.replace(name=f"{group}{_SEP}{p.name}")
                      for group, fn in loads.items() for p in option_parameters(fn())]

            def options() -> None:  # typer builds the click options from this signature
                return None

            options.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
            options.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
            scratch = typer.Typer(add_completion=False)
            scratch.command()(options)
            self.params.extend(typer.main.get_command(scratch).params)
            self._added = True

        def get_params(self, ctx: Any) -> list[Any]:
            self._load()
            return super().get_params(ctx)

        def invoke(self, ctx: Any) -> Any:
            self._load()
            given: dict[str, dict[str, Any]] = {group: {} for group in loads}
            for k in [k for k in ctx.params if _SEP in k and k.partition(_SEP)[0] in loads]:
                group, _, name = k.partition(_SEP)
                given[group][name] = ctx.params.pop(k)
            ctx.meta[_KEY] = given
            return super().invoke(ctx)

    return RecordCommand


def given_options(ctx: typer.Context, group: str = "config") -> dict[str, Any]:
    """The generated options of ``group`` the user gave: field name -> value (``None``: not
    given, left out)."""
    return {k: v for k, v in ctx.meta.get(_KEY, {}).get(group, {}).items() if v is not None}
