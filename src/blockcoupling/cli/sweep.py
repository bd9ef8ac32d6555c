"""Commands on collections: ``sweep`` (run or resume one), ``sweep-status`` (any kind of
collection) and ``collection upgrade`` (an old layout to the current format)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import (
    SPEC_RUNNERS,
    Group,
    app,
    deprecated,
    echo_json,
    guarded,
    print_plan,
    user_errors,
)
from blockcoupling.cli.app import STATE as _STATE
from blockcoupling.cli.options import (
    AddressOption,
    ClusterCpusOption,
    JsonFlag,
    checked,
    record_command,
)
from blockcoupling.errors import BlockCouplingError
from blockcoupling.jsonsafe import jsonable
from blockcoupling.validate import COUNT, EXECUTOR, RETRIES, number, rule

#: the options of a Ray cluster: nothing to --executor local
RAY_ONLY = {name: ("executor", "ray") for name in ("address", "cluster_cpus", "num_cpus",
                                                  "retries", "connect_timeout")}


@app.command(cls=record_command(requires=RAY_ONLY))
def sweep(
    spec: Annotated[Path, typer.Argument(help="The sweep spec (YAML): models, prompts, measure.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Sweep directory to write.")],
    address: AddressOption = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the sweep in --out (after a crash or a kill).")] = False,
    executor: Annotated[str | None, typer.Option(help="ray (default; a ViT grid spec: its own executor key) or local (one unit after the other in this process, for debugging).", callback=checked(EXECUTOR))] = None,
    cluster_cpus: ClusterCpusOption = None,
    num_cpus: Annotated[int | None, typer.Option(hidden=True, help="Deprecated: --cluster-cpus.", callback=checked(COUNT))] = None,
    retries: Annotated[int | None, typer.Option(help="Ray retries of a unit whose worker died (default: the spec's retries, 3).", callback=checked(RETRIES))] = None,
    connect_timeout: Annotated[float, typer.Option(help="Seconds to reach an existing Ray cluster before giving up (one error line, nothing written).", callback=checked(rule(number, above=0)))] = 60.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the spec, load every unit's model and prompts, and print each unit's plan (prompts, tokens, pairs, Jacobians, memory, an estimated time); write nothing, start no Ray.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Measure every unit of a sweep (models x revisions/checkpoints x prompt sets) on Ray.

    A spec's `kind:` says which collection it makes (none: a sweep); a ViT grid spec (`kind:
    vit-grid`, keys drop_path, weight_decay, train; see vit-grid) trains the drop-path x
    weight-decay grid instead: one Ray task per training run, finished runs kept."""
    from blockcoupling.runs import kinds

    cluster_cpus = deprecated("--num-cpus", num_cpus, "--cluster-cpus", cluster_cpus)
    with user_errors("cannot read the spec"):
        kind = kinds.get(_spec_kind(spec))
    if dry_run:
        from blockcoupling.runs.protocol import checks_only

        with user_errors("cannot read the spec"):
            if kind.plan is None:  # a kind registered without one
                raise BlockCouplingError(f"a {kind.name} spec has no --dry-run plan")
        with checks_only():  # every check of the run itself (--out too), nothing written
            _run(kind, spec, out, executor=executor, address=address, as_json=as_json,
                 cluster_cpus=cluster_cpus, resume=resume, retries=retries,
                 connect_timeout=connect_timeout)
        with user_errors("cannot read the spec"):
            plan = kind.plan(spec)
        print_plan(plan, as_json)
        return
    s = _run(kind, spec, out, executor=executor, address=address, as_json=as_json,
             cluster_cpus=cluster_cpus, resume=resume, retries=retries,
             connect_timeout=connect_timeout)
    if s is None:  # the kind's own command module ran it and said what it did
        return
    cat = s.catalogue
    failed = cat[cat["status"] == "failed"]
    sessions = s.manifest.get("sessions") or [{}]
    repaired = sessions[-1].get("repaired") or {}
    if as_json:
        echo_json({"sweep_dir": str(out), "ray_address": _where(out, bare=True) or None,
                   "done": int((cat["status"] == "done").sum()), "failed": len(failed),
                   "repaired": repaired, "units": cat, "duplicates": s.duplicates()})
    else:  # -q hides progress and chatter, never results or failures
        typer.echo(f"{(cat['status'] == 'done').sum()} of {len(cat)} units done, "
                   f"{len(failed)} failed{_where(out)}; wrote {out}")
        for r in failed.itertuples():
            typer.echo(f"  failed {r.unit_id}: {str(r.message).splitlines()[0]}")
        for uid, why in repaired.items():  # a result: never silenced
            typer.echo(f"  measured {uid} again: its files were damaged ({why})")
        if not _STATE["quiet"]:
            for r in s.duplicates().itertuples():
                typer.echo(f"  {r.unit_id} has the same weights as {r.duplicate_of} (not "
                           "counted twice in summaries)")
    if len(failed):
        raise typer.Exit(1)


def _run(kind: Any, spec: Path, out: Path, *, executor: str | None, address: str | None,
         as_json: bool, cluster_cpus: int | None, resume: bool, retries: int | None,
         connect_timeout: float) -> Any:
    """Run a spec of ``kind`` into ``out``: by the kind's own command module (which says
    what it did; None), or by the kind's run (the opened collection)."""
    if kind.name in SPEC_RUNNERS:  # the kind's own command module runs it, with every option
        SPEC_RUNNERS[kind.name](spec, out, executor=executor, address=address, as_json=as_json,
                                cluster_cpus=cluster_cpus, resume=resume, retries=retries,
                                connect_timeout=connect_timeout)
        return None
    with guarded(saved=f"finished units are saved in {out}",
                 again="continue with the same command and --resume"):
        if kind.run is None:  # a kind registered without one (and no command-line run)
            raise BlockCouplingError(f"a {kind.name} spec cannot be run by `sweep`")
        return kind.run(spec, out, executor=executor or "ray", address=address, resume=resume,
                        progress=not _STATE["quiet"], cluster_cpus=cluster_cpus,
                        retries=retries, connect_timeout=connect_timeout)


def _where(out: Path, bare: bool = False) -> str:
    """`` on the Ray cluster at ADDRESS`` of the sweep's last session ('' without Ray;
    ``bare``: the address alone)."""
    from blockcoupling.runs.read import load_manifest

    try:
        address = load_manifest(out)["sessions"][-1].get("address")
    except (BlockCouplingError, OSError, LookupError, ValueError):
        return ""
    if not address:
        return ""
    return str(address) if bare else f" on the Ray cluster at {address}"


def _spec_kind(spec: Path) -> str:
    """The collection kind a spec file states (its ``kind:``; a spec without one is the
    registry's default kind). Only a spec's own word decides, nothing is guessed."""
    from blockcoupling.runs import kinds
    from blockcoupling.runs.collection import spec_kind

    if not spec.is_file() or spec.suffix.lower() not in (".yaml", ".yml"):
        return kinds.default().name  # its parser reads it and says what is wrong
    from blockcoupling.errors import BlockCouplingError
    from blockcoupling.store.verified import load_yaml

    try:
        data = load_yaml(spec, "spec")
    except BlockCouplingError:
        return kinds.default().name  # its parser reports it with its own message
    return spec_kind(data, str(spec))


@app.command("sweep-status")
def sweep_status_cmd(
    sweep_dir: Annotated[Path, typer.Argument(help="A collection: a sweep, monitor or vit-grid directory.")],
    as_json: JsonFlag = False,
) -> None:
    """Done / running / failed units of a collection (sweep, monitor, vit-grid), with the
    failures' messages and each done unit's headline statistic."""
    from blockcoupling.runs.read import sweep_status

    with user_errors("cannot read the sweep"):
        st = sweep_status(sweep_dir)
    if as_json:
        counts = {str(k): int(v) for k, v in st["status"].value_counts().items()} if len(st) else {}
        echo_json({"sweep_dir": str(sweep_dir), "kind": _kind(sweep_dir), "counts": counts,
                   "units": jsonable(st),
                   **_unit_statistics(sweep_dir, st)})
        return
    if st.empty:
        typer.echo(f"{sweep_dir}: no units yet")
        return
    counts = st["status"].value_counts()
    typer.echo(f"{sweep_dir} ({_kind(sweep_dir)}): {len(st)} units: "
               + ", ".join(f"{n} {s}" for s, n in counts.items()))
    headlines, tokens = (_unit_headlines(sweep_dir) if (st["status"] == "done").any()
                         else ({}, None))
    for r in st.itertuples():
        step = "" if r.step is None or str(r.step) == "<NA>" else f" step {r.step}"
        line = f"  {r.status:<12s} {r.unit_id}{step}"
        if r.attempts and r.attempts > 1:
            line += f" (attempts {r.attempts})"
        if isinstance(r.duplicate_of, str):
            line += f" same weights as {r.duplicate_of}"
        if isinstance(r.message, str) and r.message:
            line += f": {r.message.splitlines()[0]}"
        typer.echo(line)
        if r.unit_id in headlines:
            typer.echo(f"      depth-wise coupling, {headlines[r.unit_id]}")
    if headlines and tokens is not None:
        from blockcoupling.engine.statistic import headline_rule

        rule = headline_rule(tokens=tokens)  # the collection's token rule (its kind's)
        typer.echo(f"  (rule: {rule})")


def _kind(root: Path) -> str:
    """The collection's kind, from its manifest."""
    from blockcoupling.runs.read import load_manifest

    return str(load_manifest(root)["kind"])


collection_app = typer.Typer(cls=Group, help="Collections (sweep, monitor, vit-grid directories): one "
                             "format, read by open_collection.", no_args_is_help=True)
app.add_typer(collection_app, name="collection")


@collection_app.command("upgrade")
def collection_upgrade(
    root: Annotated[Path, typer.Argument(help="A ViT grid in the old layout (grid.json, runs/) or a collection of an earlier format.")],
    as_json: JsonFlag = False,
) -> None:
    """Convert a directory to the current collection format in place (trained runs and
    measured units are kept, moved not copied); safe to run again."""
    from blockcoupling.runs.collection import upgrade_collection

    with user_errors("cannot upgrade the collection"):
        c = upgrade_collection(root)
    if as_json:
        echo_json({"root": str(root), "kind": c.kind, "units": jsonable(c.catalogue)})
    else:
        typer.echo(f"{root}: a {c.kind} collection of {len(c.catalogue)} units")


def _unit_statistics(sweep_dir: Path, st: Any) -> dict[str, Any]:
    """``statistic`` (the rule) and ``summary`` (each done unit's headline statistic in wide
    form) for ``sweep-status --json``; empty where no unit is done or it cannot be read."""
    from blockcoupling.engine.statistic import StatisticRule, headline_rule
    from blockcoupling.runs.read import open_sweep

    if not (st["status"] == "done").any():
        return {}
    try:
        sw = open_sweep(sweep_dir)
        summ = sw.summary(include_duplicates=True)
    except (BlockCouplingError, ImportError, OSError):
        return {}
    tokens = sw.default_tokens
    return {"statistic": StatisticRule(n_boot=0, tokens=tokens).to_dict()
            | {"description": headline_rule(tokens=tokens)}, "summary": jsonable(summ)}


def _unit_headlines(sweep_dir: Path) -> tuple[dict[str, str], str | None]:
    """(unit_id -> the headline statistic of each done unit, the token rule they used:
    ``Sweep.default_tokens``); empty where it cannot be read: the status lines still print."""
    from blockcoupling.engine.statistic import headline_wide
    from blockcoupling.runs.read import open_sweep

    try:
        sw = open_sweep(sweep_dir)
        summ = sw.summary(include_duplicates=True)
    except (BlockCouplingError, ImportError, OSError):
        return {}, None
    return ({str(r["unit_id"]): headline_wide(r) for _, r in summ.iterrows()
             if r.notna().get("k", False)}, sw.default_tokens)
