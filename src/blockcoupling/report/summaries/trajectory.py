"""Trajectories: the PCA path, the trajectory metrics per layer, top singular values and the inverse-depth fit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from blockcoupling.engine.results import Measurement
from blockcoupling.engine.spectra import fit_inverse_depth
from blockcoupling.report.summaries.common import n_layers


# ====================================================================== trajectories
def _first_prompt(m: Measurement, table: pd.DataFrame) -> str | None:
    if table.empty:
        return None
    present = set(table["prompt_id"])
    for pid in m.prompts["prompt_id"]:
        if pid in present:
            return str(pid)
    return str(table["prompt_id"].iloc[0])


def pca_data(m: Measurement, prompt_id: str | None = None) -> tuple[str, pd.DataFrame] | None:
    """(prompt id, trajectory rows of that prompt sorted by token and layer) or None."""
    tr = m.trajectory.dropna(subset=["pca_x", "pca_y"])
    pid = prompt_id if prompt_id is not None else _first_prompt(m, tr)
    if pid is None:
        return None
    rows = tr[tr["prompt_id"] == pid].sort_values(["token", "layer"])
    return (pid, rows) if not rows.empty else None


def trajectory_summary(m: Measurement, token: int | None = None) -> pd.DataFrame:
    """Per layer, over prompts and tokens (NaN skipped): ``norm`` and ``lss_window`` as mean,
    median, q25 and q75 (columns ``norm``, ``norm_median``, ``norm_q25``, ``norm_q75``, the
    same for ``lss_window``)."""
    tr = m.trajectory if token is None else m.trajectory[m.trajectory["token"] == token]
    cols = ["layer"] + [f"{c}{s}" for c in ("norm", "lss_window")
                        for s in ("", "_median", "_q25", "_q75")]
    if tr.empty:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    g = tr.groupby("layer")[["norm", "lss_window"]]
    out = g.mean()
    for suffix, q in (("_median", 0.5), ("_q25", 0.25), ("_q75", 0.75)):
        out = out.join(g.quantile(q).add_suffix(suffix))
    return out.reset_index()[cols]


def window_covers_model(m: Measurement) -> bool:
    """True when the run's ``lss_window`` is at least the L + 1 points of a trajectory: the
    windowed LSS is then (close to) the whole trajectory's LSS at every layer."""
    L = n_layers(m)
    return L is not None and int(m.config.lss_window) >= L + 1


# ====================================================================== spectra
def top_singular_values(m: Measurement, rank: int = 1, token: int | None = None) -> pd.DataFrame:
    """Per layer: mean over prompts (and tokens) of the rank-th singular value of J^l_tt
    (column ``sigma``), its median, quartiles and count."""
    sp = m.spectra
    sel = (sp["rank"] == rank) & (sp["token_in"] == sp["token_out"])
    if token is not None:
        sel &= sp["token_out"] == token
    g = sp[sel].groupby("layer")["singular_value"]
    return pd.DataFrame({"sigma": g.mean(), "median": g.median(), "q25": g.quantile(0.25),
                         "q75": g.quantile(0.75), "count": g.size()}).reset_index()


@dataclass(frozen=True)
class InverseDepthFit:
    """The least-squares fit ``sigma ~ a / l + b`` of one run's `top_singular_values`."""

    a: float
    b: float
    r2: float
    n: int
    layers: tuple[int, ...]  # the measured layers where the fit is positive (drawable)
    n_layers_measured: int  # layers in the table the fit was made on

    def __call__(self, layer: np.ndarray | float) -> np.ndarray:
        return self.a / np.asarray(layer, dtype=float) + self.b

    def describes_data(self, min_r2: float = 0.5) -> bool:
        """True when the fit explains the data (R^2 >= ``min_r2``) and is positive on every
        measured layer (a fit of singular values that goes negative does not describe them)."""
        return bool(np.isfinite(self.r2) and self.r2 >= min_r2 and self.layers
                    and len(self.layers) == self.n_layers_measured)


def inverse_depth_fit(table: pd.DataFrame) -> InverseDepthFit | None:
    """`blockcoupling.engine.spectra.fit_inverse_depth` on a `top_singular_values`
    table (None with fewer than 3 layers)."""
    if len(table) < 3:
        return None
    x = table["layer"].to_numpy(dtype=float)
    fit = fit_inverse_depth(x, table["sigma"].to_numpy(dtype=float))
    pos = tuple(int(v) for v in x if fit["a"] / v + fit["b"] > 0)
    return InverseDepthFit(float(fit["a"]), float(fit["b"]), float(fit["r2"]), int(fit["n"]),
                           pos, len(x))
