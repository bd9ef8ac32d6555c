"""``blockcoupling cross``: run A's Jacobians in run B's bases, and their principal angles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from blockcoupling.cli.app import OldJsonForm, app, echo_json, one_value, user_errors
from blockcoupling.cli.correlate import OrientationOption, statistic_option
from blockcoupling.cli.options import JsonFlag
from blockcoupling.errors import BlockCouplingError


@app.command(cls=OldJsonForm)
def cross(
    runs: Annotated[list[Path], typer.Argument(help="RUN_A RUN_B: run directories measured with --save-bases (RUN_A also with --save-jacobians, or give --model-a). More than two: every run against the last; one sweep directory: per label, every checkpoint against the last.")],
    as_json: JsonFlag = False,
    json_out: Annotated[Path | None, typer.Option("--json-out", help="Write the tables and layer x layer matrices as JSON to this file (also accepted: --json FILE.json).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the HTML page (heatmap) here.")] = None,
    k: Annotated[str | None, typer.Option("--k", help="Top-K of the figure and summary (default: the smallest measured); a list of one.", callback=statistic_option("k"))] = None,
    variant: Annotated[str, typer.Option("--variant", help="coupling, miscoupling, released_norm, ...", callback=statistic_option("variant"))] = "coupling",
    p: Annotated[str, typer.Option("--p", help="Norm of the variants that have one (1, 2, inf); a list of one.", callback=statistic_option("p"))] = "1",
    orientation: OrientationOption = "ujv",
    model_a: Annotated[str | None, typer.Option("--model-a", help="Model of RUN_A (hub id or folder), to measure its Jacobians again where RUN_A did not store them.")] = None,
) -> None:
    """Coupling across runs (checkpoint vs final, base vs fine-tuned, seed vs seed)."""
    from blockcoupling.studies.cross import cross_coupling, cross_sweep

    with user_errors("cannot read the runs or write the results"):
        from blockcoupling.engine.statistic import StatisticRule

        rule = StatisticRule(k=None if k is None else one_value(k, "--k", int),
                             variant=variant, p=one_value(p, "--p", float),
                             orientation=orientation)
        from blockcoupling.store.collection import is_sweep_dir

        if len(runs) == 1 and is_sweep_dir(runs[0]):  # per label: checkpoints vs the last
            result = cross_sweep(runs[0])
        elif len(runs) < 2:
            raise BlockCouplingError("give two run directories (RUN_A RUN_B), or more for a "
                                     "sweep against the last")
        elif len(runs) == 2:
            model = tok = None
            if model_a is not None:
                from blockcoupling.loading import ModelSource

                model, tok = ModelSource(model=model_a, device="cpu").load(progress=False)
            result = cross_coupling(runs[0], runs[1], model_a=model, tokenizer_a=tok)
        else:
            if model_a is not None:
                raise BlockCouplingError("--model-a applies to two runs only")
            result = cross_sweep(runs)
        written = []
        if json_out is not None:
            written.append(result.to_json(json_out, rule))
        if out is not None:
            from blockcoupling.report.cross import write_cross_report

            written.append(write_cross_report(result, out, rule))
        if as_json:
            echo_json(result.to_dict(rule))
            return
        text = result.summary(rule)
    typer.echo(text)  # -q hides progress and chatter, never results
    for path in written:
        typer.echo(f"wrote {path}")
