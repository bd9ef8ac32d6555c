"""Commands whose options are generated from a config record's fields (``blockcoupling.fields``).

``measure`` takes one option per exposed [`MeasureConfig`][blockcoupling.engine.config.MeasureConfig]
field, ``vit-train`` and ``vit-grid`` one per [`VitTrainConfig`][blockcoupling.studies.vit.train.VitTrainConfig]
field: the flag, the help and the default come from the record, never restated here.

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
_PREFIX = "cfg_"  # click parameter names of generated options (a field may share a command's name)


def record_command(load: Callable[[], list[Any]]) -> type[TyperCommand]:
    """A command class that adds the options ``load()`` returns (``fields.OptionSpec`` list)
    to the command's own."""

    class RecordCommand(TyperCommand):
        _added = False

        def _load(self) -> None:
            if self._added:
                return
            import inspect

            from blockcoupling.fields import option_parameters

            params = option_parameters(load())
            params = [p.replace(name=_PREFIX + p.name) for p in params]

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
            ctx.meta[_KEY] = {k.removeprefix(_PREFIX): ctx.params.pop(k)
                              for k in list(ctx.params) if k.startswith(_PREFIX)}
            return super().invoke(ctx)

    return RecordCommand


def given_options(ctx: typer.Context) -> dict[str, Any]:
    """The generated options the user gave: field name -> value (``None``: not given, left out)."""
    return {k: v for k, v in ctx.meta.get(_KEY, {}).items() if v is not None}
