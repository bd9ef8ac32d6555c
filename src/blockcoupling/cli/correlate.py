"""``blockcoupling correlate``: mean depth-wise coupling per model against benchmark scores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from blockcoupling.cli.app import OldJsonForm, app, echo_json, one_value, user_errors
from blockcoupling.cli.options import BootSeedOption, JsonFlag, NBootOption, checked_field
from blockcoupling.errors import BlockCouplingError


def statistic_option(name: str, *, listed: bool = False) -> Callable[..., Any]:
    """The check of a command's option that is a field of the headline statistic's rule
    (`StatisticRule`: ``--k``, ``--variant``, ``--p``, ``--orientation``, ``--tokens``):
    one declaration, the rule's, for every command that takes it."""
    def where() -> tuple[Any, str]:
        from blockcoupling.engine.statistic import StatisticRule

        return StatisticRule, name

    return checked_field(where, listed=listed)


OrientationOption = Annotated[str, typer.Option("--orientation", help="ujv or vju.", callback=statistic_option("orientation"))]


@app.command(cls=OldJsonForm)
def correlate(
    inputs: Annotated[list[Path], typer.Argument(help="Run directories (one per model) or a collection (a sweep, monitor or vit-grid directory: one model per done unit).")],
    scores: Annotated[str, typer.Option("--scores", help="CSV (model, score[, params_b, layers, d_model, train_tokens_t, group]), 'paper', or an lm-evaluation-harness results folder.")],
    as_json: JsonFlag = False,
    json_out: Annotated[Path | None, typer.Option("--json-out", help="Write every statistic as JSON to this file (also accepted: --json FILE.json).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the HTML page (figures inline) here.")] = None,
    k: Annotated[str | None, typer.Option("--k", help="Fixed top-K for every model (default: round(d/10) per model); several values such as 8,16,32 give the correlation at each K in one output (the paper's alignment_vary_k figure).", callback=statistic_option("k", listed=True))] = None,
    variant: Annotated[str, typer.Option("--variant", help="Comma-separated coupling variants, each a predictor (default: raw coupling as the paper, coupling_vs_null and, where every run measured it, coupling_vs_rotated: its chance-corrected forms).", callback=statistic_option("variant", listed=True))] = "",
    tokens: Annotated[str | None, typer.Option("--tokens", help="last (each prompt's last measured token, the paper's), first ([CLS]) or all (the measured tokens averaged within each prompt); default: the runs' own rule (last for language models, [CLS] for ViT runs), which they must share.", callback=statistic_option("tokens"))] = None,
    diagonal: Annotated[bool, typer.Option("--diagonal", help="Average over every layer pair including l = l' (the paper's literal wording) instead of l != l'.")] = False,
    floor: Annotated[bool, typer.Option("--floor", help="Also report what the measured chance level of raw c_K explains of the scores, and what survives it.")] = False,
    allow_mixed_prompts: Annotated[bool, typer.Option("--allow-mixed-prompts", help="Correlate models measured on different prompt sets (refused by default).")] = False,
    allow_checkpoints: Annotated[bool, typer.Option("--allow-checkpoints", help="Count checkpoints of one training run (steps or revisions of one model) as independent models (refused by default: their p-values assume independence).")] = False,
    p: Annotated[str, typer.Option("--p", help="Norm of the variants that have one, one value: 1, 2 or inf.", callback=statistic_option("p"))] = "1",
    orientation: OrientationOption = "ujv",
    n_boot: NBootOption = 2000,
    seed: BootSeedOption = 0,
    labels: Annotated[str | None, typer.Option("--labels", help="Comma-separated model names, one per run directory (default: each run's label or model id); the score table's 'model' column uses these.")] = None,
    any_revision: Annotated[bool, typer.Option("--any-revision", help="Let a model measured at a revision take the score row of its model id without that revision (e.g. the main branch's); refused by default, and named in a warning when it happens.")] = False,
) -> None:
    """Correlate each model's mean depth-wise coupling with its benchmark score.

    Three predictors by default: raw c_K (the paper's, whose chance level grows with the
    width), coupling_vs_rotated and coupling_vs_null (chance corrected against the rotated
    basis and against independent bases), each with partial correlations given log10 d_model
    and log10 parameters. Below 10 models the p-values are exact permutation
    p-values and no bootstrap interval of R^2 is given; checkpoints of one training run are
    refused unless --allow-checkpoints."""
    from blockcoupling.engine.statistic import PAPER_K
    from blockcoupling.studies.correlate import correlate as run

    with user_errors("cannot read the runs or write the results"):
        options: dict[str, Any] = dict(
            p=one_value(p, "--p", float), orientation=orientation,
            variants=[v.strip() for v in variant.split(",") if v.strip()] or None,
            tokens=tokens, diagonal=diagonal, floor=floor,
            allow_mixed_prompts=allow_mixed_prompts, allow_checkpoints=allow_checkpoints,
            n_boot=n_boot, seed=seed, any_revision=any_revision,
            labels=None if labels is None else [v.strip() for v in labels.split(",")])
        ks = _k_values(k)
        if len(ks) > 1:
            from blockcoupling.report.vary_k import write_vary_k_html
            from blockcoupling.studies.vary_k import correlate_vary_k

            _write_and_say(correlate_vary_k(inputs, scores, ks, **options), json_out, out,
                           write_vary_k_html, as_json)
            return
        result = run(inputs, scores, k=ks[0] if ks else PAPER_K, **options)
        from blockcoupling.report.correlation import write_correlation_html

        _write_and_say(result, json_out, out, write_correlation_html, as_json)


def _k_values(raw: str | None) -> list[int]:
    """``--k``: none (round(d/10) per model), one K, or several comma-separated."""
    if raw is None:
        return []
    items = [v.strip() for v in raw.split(",") if v.strip()]
    if not items:
        raise BlockCouplingError("--k: give a positive integer such as 10, or several: 8,16,32")
    return [one_value(v, "--k", int) for v in items]


@app.command("chance-floor", cls=OldJsonForm)
def chance_floor(
    scores: Annotated[str, typer.Option("--scores", help="'paper' (the paper's Table 1, shipped) or a CSV with model, score, d_model[, group].")],
    k_rule: Annotated[str, typer.Option("--k-rule", help="d/10 (the paper's K = round(d/10) per model) or a fixed K.", callback=statistic_option("k"))] = "d/10",
    as_json: JsonFlag = False,
    json_out: Annotated[Path | None, typer.Option("--json-out", help="Write the floor values and regressions as JSON to this file (also accepted: --json FILE.json).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the HTML page (figure inline) here.")] = None,
) -> None:
    """How much of a score table the width alone explains: each model's flat-spectrum chance
    level of raw c_K, 1 - sqrt(1/d + 1/K), regressed against its score. Needs no model."""
    from blockcoupling.studies.chance_floor import chance_floor as run

    with user_errors("cannot read the scores or write the results"):
        result = run(scores, k_rule=k_rule)
        from blockcoupling.report.correlation import write_chance_floor_html

        _write_and_say(result, json_out, out, write_chance_floor_html, as_json)


def _write_and_say(result: Any, json_out: Path | None, out: Path | None,
                   write_html: Callable[[Any, Path], Path], as_json: bool) -> None:
    """Write the JSON file (``result.to_json``) and the HTML page asked for, then print the
    result: as JSON on stdout with ``as_json``, else its summary and what was written (-q
    hides progress and chatter, never results)."""
    written = []
    if json_out is not None:
        written.append(result.to_json(json_out))
    if out is not None:
        written.append(write_html(result, out))
    if as_json:
        echo_json(result.to_dict())
        return
    typer.echo(result.summary())
    for path in written:
        typer.echo(f"wrote {path}")
