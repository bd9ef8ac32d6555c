"""Emergence figures from a sweep or a training monitor: coupling across training (paper
fig. 1b-e), drawn from any `Collection` (the report layer imports nothing from the studies).

Coupling and trajectory metrics against the training step (a log axis; models without steps
are bars), the windowed LSS against the layer, and layer graphs and depth-wise heatmaps at
chosen checkpoints (`blockcoupling.report.figures`); values from `Collection.summary` (units
with duplicate weights counted once). `write_emergence_report` writes them as one page with
the unit catalogue (``blockcoupling report DIR``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from blockcoupling.engine.statistic import LEAD_VARIANTS, StatisticRule
from blockcoupling.errors import RunDirError
from blockcoupling.report import figures as F
from blockcoupling.report.page import Section, esc, figure_html, html_path, table_html, write_page
from blockcoupling.store.verified import SealedLog


class Collection(Protocol):
    """A collection of measured units (what the emergence page draws): its folder, its kind
    (``sweep`` or ``monitor``), its catalogue (one row per unit: ``unit_id, label, step, revision, prompt_set, status,
    attempts, duplicate_of, message``), a summary table (one row per done unit:
    ``unit_id, label, step, k``, the headline statistic ``coupling_vs_null_mean,
    coupling_vs_null_se, coupling_mean, coupling_se, coupling_chance`` and ``lss,
    expodistance``) and each unit's run."""

    root: Path
    catalogue: pd.DataFrame

    @property
    def kind(self) -> str: ...

    def summary(self, *, k: int | None = None) -> pd.DataFrame: ...

    def open_unit(self, unit_id: str) -> Any: ...


#: the training loss a monitor stores beside its units: JSON lines {"step": N, "loss": x}
LOSS_FILE = "training_loss.jsonl"


def loss_repair(root: Path) -> str:
    """What a reader of a damaged loss log is told (no command rebuilds it)."""
    return (f"Delete {root / LOSS_FILE} and {root / LOSS_FILE}.seal, or restore them from a "
            "backup: the page then draws no training loss (the coupling, stored in the units, "
            "is kept)")


def loss_log(root: Path) -> SealedLog:
    """The training-loss log of a monitor directory (``store.verified.SealedLog``)."""
    return SealedLog(root / LOSS_FILE, loss_repair(root))


def read_training_loss(root: str | os.PathLike[str]) -> pd.DataFrame:
    """``step``, ``loss`` from ``ROOT/training_loss.jsonl`` (the last value of each step;
    empty when there is none)."""
    path = Path(root) / LOSS_FILE
    rows = loss_log(Path(root)).read()
    for i, row in enumerate(rows):
        step, loss = row.get("step"), row.get("loss")
        if not isinstance(step, int) or isinstance(step, bool) or not (
                loss is None or isinstance(loss, (int, float)) and not isinstance(loss, bool)):
            raise RunDirError(f"{path} line {i + 1} is not a training loss record (step, loss). "
                              + loss_repair(Path(root)))
    if not rows:
        return pd.DataFrame({"step": pd.Series(dtype="int64"), "loss": pd.Series(dtype="float64")})
    df = pd.DataFrame(rows, columns=["step", "loss"]).astype({"step": "int64",
                                                              "loss": "float64"})
    return df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)


def headline_column(summ: pd.DataFrame) -> tuple[str, str]:
    """The summary column of the headline statistic and its axis label: the leading variant
    ``coupling_vs_rotated`` where any unit measured it, else ``coupling_vs_null``, else raw
    c_K (``coupling``, units measured before either existed)."""
    for v in LEAD_VARIANTS:
        if f"{v}_mean" in summ.columns and summ[f"{v}_mean"].notna().any():
            return v, f"coupling above chance ({v})"
    return "coupling", "raw c_K (mean depth-wise coupling)"


def plot_loss_vs_step(loss: pd.DataFrame, summ: pd.DataFrame) -> Figure:
    """The training loss against the step, with the headline statistic of the measured steps
    (`headline_column`, error bars one standard error over prompts) on a second axis."""
    if loss.empty:
        raise F.FigureUnavailable("no training loss was stored (CouplingMonitor.step(loss=) "
                                  "or the Trainer callback)")
    fig, (ax,) = _figure(6.4, 3.6)
    ax.plot(loss["step"].astype(float), loss["loss"], "-", color="0.3", label="training loss")
    ax.set_ylabel("training loss")
    _step_axis(ax, loss["step"])
    stepped = summ[summ["step"].notna()] if len(summ) else summ
    col, name = headline_column(stepped) if len(stepped) else ("coupling", "")
    stepped = stepped[stepped[f"{col}_mean"].notna()] if len(stepped) else stepped
    if len(stepped):
        twin = ax.twinx()
        colors = _colors(list(dict.fromkeys(stepped["label"].astype(str))))
        for lab, g in stepped.sort_values("step").groupby("label", sort=False):
            twin.errorbar(g["step"].astype(float).to_numpy(), g[f"{col}_mean"],
                          yerr=g[f"{col}_se"], fmt="o-", ms=4, capsize=2,
                          color=colors[str(lab)], label=str(lab))
        twin.set_ylabel(name.replace(" (", "\n(", 1))  # two lines: the variant's name is long
        twin.legend(fontsize="small", loc="upper right")
    ax.grid(alpha=0.3)
    return fig


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _step_axis(ax: Any, steps: pd.Series) -> None:
    """Log step axis; with a step 0, a symmetric-log axis linear below step 1."""
    s = steps.dropna().astype(float)
    if len(s) and s.min() <= 0:
        ax.set_xscale("symlog", linthresh=1.0, linscale=0.5)
    elif len(s) and s.max() / max(s.min(), 1.0) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("training step")


def _colors(labels: Sequence[str]) -> dict[str, Any]:
    cmap = colormaps["tab10"]
    return {lab: cmap(i % 10) for i, lab in enumerate(labels)}


def _summary(sweep: Collection | pd.DataFrame, k: int | None) -> pd.DataFrame:
    df = sweep if isinstance(sweep, pd.DataFrame) else sweep.summary(k=k)
    if df.empty:
        raise F.FigureUnavailable("no unit of the sweep is done yet")
    return df


def plot_coupling_vs_step(sweep: Collection | pd.DataFrame, *, k: int | None = None) -> Figure:
    """The headline statistic against the step, per model: the chance-corrected
    ``coupling_vs_rotated`` and ``coupling_vs_null`` (0 = chance) where measured, and raw c_K
    with its chance level c_null (dashed); error bars one standard error over prompts
    (within one model). Units without a step are bars."""
    df = _summary(sweep, k)
    has = {c for c in ("coupling_vs_rotated", "coupling_vs_null", "coupling")
           if f"{c}_mean" in df.columns and df[f"{c}_mean"].notna().any()}
    null_name = ("vs independent bases (coupling_vs_null)" if "coupling_vs_rotated" in has
                 else "coupling above chance (coupling_vs_null)")
    panels = [(c, name) for c, name in
              (("coupling_vs_rotated", "above chance (coupling_vs_rotated)"),
               ("coupling_vs_null", null_name),
               ("coupling", "raw c_K (dashed: chance level)")) if c in has]
    if not panels:
        raise F.FigureUnavailable("no depth-wise coupling was measured (add depth to "
                                  "measure.coupling)")
    stepped = df[df["step"].notna()]
    plain = df[df["step"].isna()]
    rows = [r for r in (stepped, plain) if len(r)]
    fig, axes = _figure(4.5 * len(panels) * len(rows), 3.8, len(panels) * len(rows))
    colors = _colors(list(dict.fromkeys(df["label"].astype(str))))
    for ri, part in enumerate(rows):
        for pi, (col, name) in enumerate(panels):
            ax = axes[ri * len(panels) + pi]
            if part is stepped:
                for lab, g in part.groupby("label", sort=False):
                    g = g.sort_values("step")
                    x = g["step"].astype(float).to_numpy()
                    ax.errorbar(x, g[f"{col}_mean"], yerr=g[f"{col}_se"], fmt="o-", ms=4,
                                capsize=2, color=colors[str(lab)], label=str(lab))
                    if col == "coupling" and g["coupling_chance"].notna().any():
                        ax.plot(x, g["coupling_chance"], "--", color=colors[str(lab)],
                                alpha=0.7, label=f"{lab}: chance")
                _step_axis(ax, part["step"])
            else:
                xs = np.arange(len(part))
                ax.bar(xs, part[f"{col}_mean"], yerr=part[f"{col}_se"], capsize=3,
                       color=[colors[str(lab)] for lab in part["label"]])
                if col == "coupling" and part["coupling_chance"].notna().any():
                    ax.scatter(xs, part["coupling_chance"], marker="_", s=400, color="k",
                               label="chance", zorder=3)
                ax.set_xticks(xs, [str(x) for x in part["label"]], rotation=30, ha="right")
            if col != "coupling":
                ax.axhline(0.0, color="0.5", lw=0.8, ls=":")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
            if part is stepped and pi == 0:
                ax.legend(fontsize="small")
    return fig


def plot_trajectory_vs_step(sweep: Collection | pd.DataFrame, *, k: int | None = None) -> Figure:
    """Mean line-shape score and median expodistance against the step, per model."""
    df = _summary(sweep, k)
    stepped = df[df["step"].notna()]
    if stepped.empty or stepped[["lss", "expodistance"]].isna().all().all():
        raise F.FigureUnavailable("no trajectory metrics at training steps (units need a "
                                  "step and measure.trajectory: true)")
    fig, axes = _figure(9.0, 3.6, 2)
    colors = _colors(list(dict.fromkeys(stepped["label"].astype(str))))
    for ax, col, name in ((axes[0], "lss", "mean LSS"),
                          (axes[1], "expodistance", "median expodistance")):
        for lab, g in stepped.groupby("label", sort=False):
            g = g.sort_values("step")
            ax.plot(g["step"].astype(float), g[col], "o-", color=colors[str(lab)],
                    label=str(lab))
        _step_axis(ax, stepped["step"])
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    return fig


def chosen_checkpoints(sweep: Collection, *, steps: Sequence[int] | None = None,
                       per_model: int = 3) -> list[str]:
    """Unit ids for the per-checkpoint figures: the given ``steps`` of every model, else
    ``per_model`` steps spread evenly on the log axis (first, ..., last) per model."""
    summ = sweep.summary()
    stepped = summ[summ["step"].notna()]
    ids: list[str] = []
    for _, g in stepped.groupby("label", sort=False):
        g = g.sort_values("step")
        if steps is not None:
            ids += g[g["step"].isin([int(s) for s in steps])]["unit_id"].tolist()
            continue
        pos = np.log1p(g["step"].astype(float).to_numpy())
        targets = np.linspace(pos.min(), pos.max(), min(per_model, len(g)))
        picks = dict.fromkeys(int(np.abs(pos - t).argmin()) for t in targets)
        ids += [g["unit_id"].iloc[i] for i in picks]
    if not ids:  # no steps: one panel per model
        ids = summ["unit_id"].tolist()[: max(per_model, 1) * 2]
    return [str(i) for i in ids]


def _unit_runs(sweep: Collection, ids: Sequence[str]) -> tuple[list[Any], list[str]]:
    cat = sweep.catalogue.set_index("unit_id")
    runs, labels = [], []
    for uid in ids:
        runs.append(sweep.open_unit(uid))
        row = cat.loc[uid]
        step = row["step"]
        labels.append(f"{row['label']} step {int(step)}" if not pd.isna(step)
                      else str(row["label"]))
    return runs, labels


def windowed_lss_by_layer(run: Any) -> pd.DataFrame:
    """``layer``, ``lss_window`` (mean over prompts and tokens) and ``n`` of one run's
    trajectory table, layers whose window LSS is defined."""
    tr = run.trajectory.dropna(subset=["lss_window"])
    g = tr.groupby("layer")["lss_window"]
    return pd.DataFrame({"lss_window": g.mean(), "n": g.size()}).reset_index()


def plot_windowed_lss(sweep: Collection, ids: Sequence[str]) -> Figure:
    """The mean windowed line-shape score against the layer, one line per chosen checkpoint
    (colour: the step, light to dark), one panel per model [paper fig. 25 right: Pythia 12B,
    a window of 11 layers centred on each layer]."""
    runs, labels = _unit_runs(sweep, ids)
    cat = sweep.catalogue.set_index("unit_id")
    models = list(dict.fromkeys(str(cat.loc[u, "label"]) for u in ids))
    fig, axes = _figure(4.6 * len(models), 3.6, len(models))
    cmap = colormaps["viridis"]
    drawn = False
    for ax, model in zip(axes, models, strict=True):
        mine = [(u, r, lab) for u, r, lab in zip(ids, runs, labels, strict=True)
                if str(cat.loc[u, "label"]) == model]
        for j, (_u, run, lab) in enumerate(mine):
            prof = windowed_lss_by_layer(run)
            if prof.empty:
                continue
            colour = cmap(0.15 + 0.7 * j / max(len(mine) - 1, 1))
            ax.plot(prof["layer"], prof["lss_window"], "o-", ms=3, color=colour, label=lab)
            drawn = True
        ax.set_title(model, fontsize="medium")
        ax.set_xlabel("layer l (centre of the window)")
        ax.set_ylabel("mean windowed LSS")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    if not drawn:
        raise F.FigureUnavailable("no windowed LSS in the chosen units (measure.trajectory: "
                                  "true, and a window shorter than the model)")
    return fig


def plot_layer_graphs(sweep: Collection, ids: Sequence[str], *, k: int | None = None) -> Figure:
    """Layer adjacency graphs (paper fig. 1c-e) of the units ``ids``, one scale."""
    runs, labels = _unit_runs(sweep, ids)
    return F.plot_layer_graph(runs, replace(F.REPORT_RULE, k=k), labels=labels)


def heatmap_variant(runs: Sequence[Any]) -> str:
    """The variant of the per-checkpoint heatmaps: raw ``coupling`` where every run with
    depth-wise rows measured it, else the chance-corrected ``coupling_vs_null``."""
    depth = [m.coupling[m.coupling["kind"] == "depth"] for m in runs]
    if all((d["variant"] == "coupling").any() for d in depth if len(d)):
        return "coupling"
    return "coupling_vs_null"


def plot_depth_heatmaps(sweep: Collection, ids: Sequence[str], *, k: int | None = None) -> Figure:
    """L x L depth-wise coupling heatmaps of the units ``ids``, one colour scale
    (`heatmap_variant`)."""
    runs, labels = _unit_runs(sweep, ids)
    return F.plot_depth_heatmap(runs, StatisticRule(variant=heatmap_variant(runs), k=k),
                                labels=labels)


# ====================================================================== HTML
def _units_frame(sweep: Collection, summ: pd.DataFrame) -> pd.DataFrame:
    """The catalogue with each unit's summary values (for the page's unit table)."""
    cat = sweep.catalogue
    cols = ["label", "step", "revision", "prompt_set", "status", "attempts", "duplicate_of"]
    df = cat.set_index("unit_id")[cols].copy()
    vals = summ.set_index("unit_id") if len(summ) else pd.DataFrame()
    for c, name in (("coupling_vs_rotated_mean", "above chance (rotated basis)"),
                    ("coupling_vs_rotated_se", "± se"),
                    ("coupling_vs_null_mean", "vs independent bases"),
                    ("coupling_vs_null_se", "± se "), ("coupling_mean", "raw c_K"),
                    ("coupling_chance", "chance c_K"), ("lss", "LSS"),
                    ("expodistance", "expodistance")):
        df[name] = [float(vals[c].get(u)) if len(vals) and c in vals.columns
                    and u in vals.index else float("nan") for u in df.index]
    df["message"] = [None if pd.isna(m) else str(m).splitlines()[0] for m in cat["message"]]
    df["step"] = [None if pd.isna(x) else int(x) for x in df["step"]]
    df.index.name = "unit"
    return df.astype(object).where(df.notna(), None)


def write_emergence_report(sweep: Collection, out: str | os.PathLike[str],
                           *, steps: Sequence[int] | None = None, k: int | None = None,
                           formats: Sequence[str] = ("png", "svg", "pdf"),
                           title: str | None = None) -> Path:
    """Write the emergence report of a collection (an opened sweep or monitor directory:
    ``open_sweep(path)``) to ``out`` (.html) and
    its figures to ``<out stem>_figures/``; returns the HTML path. ``steps`` picks the
    checkpoints of the per-checkpoint figures (default: first, middle, last per model)."""
    s = sweep
    out = html_path(out)
    summ = s.summary(k=k)
    fig_dir = out.parent / f"{out.stem}_figures"
    ids = chosen_checkpoints(s, steps=steps) if len(summ) else []
    kk = int(summ["k"].dropna().min()) if len(summ) and summ["k"].notna().any() else k
    specs = [
        ("coupling_vs_step", "Mean depth-wise coupling across training",
         lambda: plot_coupling_vs_step(summ),
         f"The headline statistic (K={kk}; mean over prompts of the per-prompt mean over "
         "layer pairs l != l' at each prompt's last measured token, p=1, ujv) of each unit "
         "against its training step on a log axis (step 0 on a short linear stretch), one "
         "line per model, error bars one standard error over prompts (within one model). "
         "From the left, where measured: coupling above chance against the same basis "
         "rotated at random (coupling_vs_rotated, 0 = its chance level), against independent "
         "random bases (coupling_vs_null), and raw c_K with, dashed, its chance level c_null "
         "(see the conventions). "
         "Models without a step are bars. Units whose weights repeat an earlier unit's are "
         "counted once."),
        ("trajectory_vs_step", "Trajectory metrics across training",
         lambda: plot_trajectory_vs_step(summ),
         "Mean line-shape score (1 = straight trajectory) and median expodistance (0 = "
         "exact exponential growth of the norms) over prompts and tokens, against the step."),
        ("loss_vs_step", "Training loss and coupling",
         lambda: plot_loss_vs_step(read_training_loss(s.root), summ),
         "Training loss as the training loop reported it (grey; stored by the coupling "
         f"monitor) against the step, with the {headline_column(summ)[1]} of the measured "
         "steps (as in the first figure, error bars one standard error over prompts) on the "
         "right axis."),
        ("windowed_lss", "Windowed line-shape score across depth at chosen checkpoints",
         lambda: plot_windowed_lss(s, ids),
         "Mean over prompts and tokens of the line-shape score on a window of layers centred "
         "on each layer (the run's lss_window; windows clipped at the ends), against the "
         "layer, one line per checkpoint, darker = later (the paper's fig. 25 right)."),
        ("layer_graphs", "Layer adjacency graphs at chosen checkpoints",
         lambda: plot_layer_graphs(s, ids, k=k),
         "Layers on a circle (layer 1 at the top, clockwise); edge width and opacity grow "
         "with the mean depth-wise coupling of the two layers, one scale across panels."),
        ("depth_heatmaps", "Depth-wise coupling per checkpoint",
         lambda: plot_depth_heatmaps(s, ids, k=k),
         "L x L depth-wise coupling (rows: measured layer l, columns: basis layer l'; "
         f"{heatmap_variant([s.open_unit(u) for u in ids])} with K={kk}, p=1, ujv), mean "
         "over prompts, one colour scale across panels."),
    ]
    if read_training_loss(s.root).empty and s.kind != "monitor":  # no training loop: no loss
        specs = [sp for sp in specs if sp[0] != "loss_vs_step"]
    sections = [Section("units", "Units", table_html(_units_frame(s, summ)))]
    skipped = []
    number = 0
    for name, head, make, caption in specs:
        if not ids and name in ("layer_graphs", "depth_heatmaps", "windowed_lss"):
            skipped.append(f"{head}: no unit is done")
            continue
        try:
            fig = make()
        except F.FigureUnavailable as err:
            skipped.append(f"{head}: {err}")
            continue
        number += 1
        body = figure_html(fig, caption, title=head, number=number,
                           stem=fig_dir / f"{number:02d}_{name}", formats=formats)
        sections.append(Section(name, head, body))
    if skipped:
        sections.append(Section("skipped", "Not drawn",
                                "<ul>" + "".join(f"<li>{esc(x)}</li>" for x in skipped)
                                + "</ul>"))
    counts = s.catalogue["status"].value_counts().to_dict() if len(s.catalogue) else {}
    lead = (f"<p>{esc(len(s.catalogue))} units ("
            f"{esc(', '.join(f'{n} {st}' for st, n in counts.items()))}) in "
            f"<code>{esc(s.root)}</code>. Layers are numbered from 1.</p>")
    return write_page(out, title or f"blockcoupling emergence report: {s.root.name}",
                      sections, lead=lead)


__all__ = ["Collection", "LOSS_FILE", "loss_log", "loss_repair", "chosen_checkpoints", "headline_column", "heatmap_variant",
           "plot_coupling_vs_step", "plot_depth_heatmaps", "plot_layer_graphs",
           "plot_loss_vs_step", "plot_trajectory_vs_step", "plot_windowed_lss",
           "read_training_loss", "windowed_lss_by_layer", "write_emergence_report"]
