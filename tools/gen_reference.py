"""Generate the reference pages of the documentation site (run by docs/hooks.py at every
``mkdocs build``, hence by ``make docs``; also by hand: ``python tools/gen_reference.py cli``).

* ``cli_markdown()``: the command-line reference, from the typer application by click
  introspection (every command, its help text, usage, arguments and options with defaults),
  so the page cannot drift from the commands. Duck-typed: typer 0.29 carries its own copy of
  click's classes.
* ``families_markdown()``: the model families blockcoupling is checked on, from the list the
  conformance matrix runs (``tests/helpers/families.py``, ``tests/engine/test_families.py``): per family its
  blocks and final norm, the fast path or the generic path (why), the transformers versions it
  is checked on (the oldest supported, pinned in ``constraints-oldest.txt``, and the version
  this build ran with: the newest pip resolved, in CI).
* ``api_markdown()``: the Python API reference, one mkdocstrings ``:::`` directive per public
  name of ``blockcoupling`` (its ``_EXPORTS``, grouped by module), so a new export appears in
  the reference without editing the page.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_SECTIONS: dict[str, str] = {  # module -> heading of the API page
    "blockcoupling.engine.measure": "Measuring",
    "blockcoupling.engine.config": "Configuration",
    "blockcoupling.engine.results": "Results",
    "blockcoupling.engine.inputs": "Inputs",
    "blockcoupling.engine.events": "Progress events",
    "blockcoupling.engine.blocks": "Finding the blocks",
    "blockcoupling.prompts.sources": "Prompts",
    "blockcoupling.runs.statistic": "The headline statistic",
    "blockcoupling.store.record": "Run directories",
    "blockcoupling.store.reader": "Run directories",
    "blockcoupling.report.html": "Reports",
    "blockcoupling.studies.monitor": "Training-time monitoring",
    "blockcoupling.studies.sweep": "Sweeps",
    "blockcoupling.runs.read": "Collections (sweeps, monitors, ViT grids)",
    "blockcoupling.studies.correlate": "Coupling and generalisation",
    "blockcoupling.studies.model_units": "Coupling and generalisation",
    "blockcoupling.studies.scores": "Coupling and generalisation",
    "blockcoupling.studies.regression": "Coupling and generalisation",
    "blockcoupling.studies.vit.train": "The ViT study",
}


def _is(param: Any, kind: str) -> bool:
    """Whether a click parameter is an ``"option"`` or an ``"argument"``."""
    return getattr(param, "param_type_name", "") == kind


def _text(help_text: str) -> str:
    """A command's help as Markdown: click's ``\\b`` no-rewrap markers dropped."""
    return "\n".join(line for line in help_text.strip().splitlines() if line.strip() != "\b")


def _type_name(param: Any) -> str:
    """What an option takes, from its annotation (``int``, ``str``, ``Path``, ...)."""
    desc = getattr(param, "type_descriptor", None)
    ann = getattr(desc, "annotation", None)
    if ann is None and getattr(param, "type", None) is not None:  # plain click
        return str(param.type.name)
    name = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
    return {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "Path": "PATH"}.get(name, name)


def _option_row(param: Any) -> str:
    """One table row: the option's flags, what it takes, its default and its help."""
    if _is(param, "option"):
        flags = ", ".join(f"`{o}`" for o in param.opts)
        if param.secondary_opts:
            flags += " / " + ", ".join(f"`{o}`" for o in param.secondary_opts)
        kind = "flag" if param.is_flag else f"`{_type_name(param)}`"
        default = param.default
        if callable(default) or default is None or param.show_default is False:
            shown = ""
        elif isinstance(default, bool):
            shown = "on" if default else "off"
        elif isinstance(default, (list, tuple)):
            shown = ", ".join(str(x) for x in default)
        else:
            shown = str(default)
        help_text = (param.help or "").replace("|", "\\|").replace("\n", " ")
        if param.required:
            help_text = "**required**. " + help_text
        return f"| {flags} | {kind} | {f'`{shown}`' if shown else ''} | {help_text} |"
    raise TypeError(param)


def _command_markdown(name: str, cmd: Any, ctx: Any) -> list[str]:
    sub = cmd.context_class(cmd, info_name=name, parent=ctx)
    lines = [f"## `blockcoupling {name}`", ""]
    if cmd.help:
        lines += [_text(cmd.help), ""]
    usage = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), cmd.get_usage(sub).strip())
    lines += ["```text", usage, "```", ""]
    args = [p for p in cmd.params if _is(p, "argument")]
    if args:
        lines += ["**Arguments**", ""]
        for a in args:
            what = getattr(a, "help", None) or ""
            many = " (one or more)" if a.nargs == -1 else ""
            lines.append(f"- `{(a.metavar or a.name or '').upper()}`{many}{': ' + what if what else ''}")
        lines.append("")
    opts = [p for p in cmd.params if _is(p, "option") and not p.hidden]
    if opts:
        lines += ["| option | takes | default | help |", "|---|---|---|---|"]
        lines += [_option_row(p) for p in opts]
        lines.append("")
    return lines


def cli_markdown() -> str:
    """The command-line reference as Markdown, generated from the typer application."""
    import typer.main

    from blockcoupling.cli import app

    group: Any = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="blockcoupling")
    lines = [
        "# Command line",
        "",
        "Generated from the commands themselves (`tools/gen_reference.py`, at every docs build):",
        "the same text as `blockcoupling COMMAND --help`. Exit codes: 0 success, 1 a user error",
        "(one line that says what to do), 2 bad usage; 130 / 143 after Ctrl-C / SIGTERM.",
        "",
        "```text",
        group.get_usage(ctx).strip(),
        "```",
        "",
    ]
    if group.help:
        lines += [_text(group.help), ""]
    global_opts = [p for p in group.params if _is(p, "option") and not p.hidden]
    if global_opts:
        lines += ["Options of `blockcoupling` itself (before the command):", "",
                  "| option | takes | default | help |", "|---|---|---|---|"]
        lines += [_option_row(p) for p in global_opts]
        lines.append("")
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        lines += _command_markdown(name, cmd, ctx)
    return "\n".join(lines) + "\n"


def api_markdown() -> str:
    """The Python API reference as Markdown: one mkdocstrings directive per public name."""
    import blockcoupling

    lines = [
        "# Python API",
        "",
        "Every public name of `blockcoupling` (`import blockcoupling as bc`; `bc.__all__`),",
        "rendered from its docstring. The page is generated from the package's export list",
        "(`tools/gen_reference.py`); `tests/project/test_docs.py` fails when a public name has no",
        "docstring.",
        "",
    ]
    by_section: dict[str, list[str]] = {}
    for module, names in blockcoupling._EXPORTS.items():
        section = _SECTIONS.get(module, module)
        by_section.setdefault(section, []).extend(f"{module}.{n}" for n in names)
    by_section["Errors"] = [f"blockcoupling.errors.{n}" for n in sorted(blockcoupling.__all__)
                            if n.endswith("Error")]
    import blockcoupling.studies as studies

    seen = {path.rsplit(".", 1)[1] for paths in by_section.values() for path in paths}
    by_section["Studies (blockcoupling.studies)"] = [
        f"blockcoupling.studies.{n}" for n in studies.__all__ if n not in seen]
    for section, paths in by_section.items():
        lines += [f"## {section}", ""]
        for path in paths:
            lines += _entry(path)
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _entry(path: str) -> list[str]:
    """One public name on the API page: its docstring; for a config record (``MeasureConfig``,
    ``VitTrainConfig``) a table of its fields first (type, default, CLI flag, help), then its
    docstring and methods without the generated signature and field list (whose defaults
    would read as the ``opt(...)`` declarations)."""
    import importlib

    from blockcoupling.fields import field_docs, is_record

    module, name = path.rsplit(".", 1)
    obj = getattr(importlib.import_module(module), name, None)
    if not is_record(obj):
        return [f"::: {path}", ""]
    docs = field_docs(obj)
    hidden = "|".join(d.name for d in docs)
    lines = [f"`{name}(...)` takes its fields as keyword arguments ([`{name}`][{path}] below: "
             "its methods):", "",
             "| field | type | default | CLI | what it is |", "|---|---|---|---|---|"]
    for d in docs:
        default = "required" if d.default is None else f"`{_cell(d.default)}`"
        lines.append(f"| `{d.name}` | `{_cell(d.type)}` | {default} | "
                      f"{f'`{d.flag}`' if d.flag else ''} | {_cell(d.help)} |")
    return lines + ["", f"::: {path}", "    options:", "      show_signature: false",
                    f'      filters: ["!^_", "!^({hidden})$"]', ""]


def oldest_supported(package: str = "transformers") -> str:
    """The oldest release of ``package`` that CI tests (its pin in ``constraints-oldest.txt``)."""
    for line in (ROOT / "constraints-oldest.txt").read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep and name.strip().lower() == package:
            return version.strip()
    raise LookupError(f"constraints-oldest.txt pins no {package}")


def _families_module() -> Any:
    spec = importlib.util.spec_from_file_location("bc_families", ROOT / "tests" / "helpers" / "families.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def families_markdown() -> str:
    """The model-families page: the conformance matrix's list as a table."""
    import transformers
    from packaging.version import Version

    fam = _families_module()
    oldest, now = oldest_supported(), transformers.__version__

    def versions(f: Any) -> str:
        low = max(Version(oldest), Version(f.since))
        return f"{low} and {now}" if Version(now) > low else str(now)

    return "\n".join([
        "# Model families",
        "",
        "Every family below is measured by the conformance matrix (`tests/engine/test_families.py`, in",
        "the default test-suite) on a tiny random-weight model built from the family's",
        "HuggingFace config: `find_blocks` must find its blocks, final norm and causality;",
        "depth-wise and token-wise (`self`) coupling of every variant must equal an independent",
        "float64 autograd oracle; and every decoder's Jacobians `J^l_tt` must come from the",
        "decode-step fast path at every layer with no fallback warning, unless the table says",
        "why not (the generic path gives the same values, several times slower). Generated from",
        "the same list (`tests/helpers/families.py`) at every docs build.",
        "",
        f"Checked on transformers {oldest} (the oldest supported: CI runs the engine tests and",
        "this matrix in a second environment pinned by `constraints-oldest.txt`; `make",
        f"test-compat`) and {now} (the version this page was built with: in CI, the newest",
        "that pip resolved that day). A family newer than the oldest supported release is",
        "checked from its first release on. Which layers took the fast path in a run:",
        "`meta[\"fast_path\"]`, `Measurement.fast_path`, and a line of `blockcoupling show`.",
        "The block paths are those of the base model (`AutoModel`); a model with a task head",
        "adds its prefix (`transformer.h`, `model.layers`), found the same way.",
        "",
        fam.markdown_table(versions),
        "",
    ])


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "cli"
    pages = {"cli": cli_markdown, "api": api_markdown, "families": families_markdown}
    sys.stdout.write(pages[which]())
