"""Pure pandas summaries of stored measurements: what the figures draw and the report states.

Nothing here imports matplotlib (the correlation, sweep and monitor studies read these
summaries without plotting) and nothing recomputes a Jacobian: every function reads the tidy
tables of a :class:`~blockcoupling.engine.results.Measurement` (``coupling``, ``trajectory``,
``token_metrics``, ``spectra``, ``prompts``) and its ``A/<prompt_id>/<orientation>`` arrays.

Conventions shared by every function:

- ``runs``: one Measurement or a sequence of them (a trained model next to its random
  initialisation, training checkpoints, different models); results come back in run order.
- ``k=None`` means each run's smallest measured K; ``p`` applies to the variants that take one
  (``P_VARIANTS``); ``orientation`` is ``ujv`` or ``vju``.
- Where a run lacks the data, per-run lists hold ``None``; where no run has it, the function
  raises :class:`NoData` (a :class:`~blockcoupling.errors.BlockCouplingError` whose message
  says what to measure).
- Robust statistics (median and quartiles) sit next to means wherever a quantity is
  heavy-tailed (expodistance of post-LN models reaches 1e5 on single tokens).
- ``coupling_vs_null`` = 1 - m / m_null (``docs/conventions.md``): 0 at the chance level of
  unrelated bases, 1 for perfect coupling. The chance coupling ``c_null`` itself is recovered
  row by row from the ``coupling`` and ``coupling_vs_null`` rows of the same Jacobian pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.engine import names
from blockcoupling.engine.results import TABLES, Measurement
from blockcoupling.engine.spectra import fit_inverse_depth
from blockcoupling.engine.statistic import HEADLINE_VARIANTS
from blockcoupling.errors import BlockCouplingError

Runs = Measurement | Sequence[Measurement]

#: variants whose normaliser takes a user-chosen p (the others store p empty or fixed):
#: the engine's one list (coupling_vs_null does not depend on p and is stored with p empty)
P_VARIANTS: tuple[str, ...] = names.P_VARIANTS
#: variants where a larger value means more coupled (for the others, smaller is more coupled)
HIGHER_IS_COUPLED: dict[str, bool] = {
    "coupling": True,
    "coupling_vs_null": True,
    "miscoupling": False,
    "released_norm": False,
    "released_trace": False,
    "offdiag_ratio": False,
}
TOKEN_KINDS: tuple[str, ...] = ("self", "fixed_input", "fixed_output")
#: why ``expodistance`` is NaN for a token (docs/conventions.md, "Trajectories")
EXPODISTANCE_NAN_REASON = ("its norms ||x^l|| do not change beyond the rounding of the stored "
                           "hidden states (e.g. a post-LN block's LayerNorm fixes them), so "
                           "there is no growth rate")
#: a median |coupling_vs_null| below this counts as "at the chance level" in the report text
CHANCE_BAND = 0.05


class NoData(BlockCouplingError):
    """The data a summary or figure needs was not measured (e.g. no ``self`` coupling rows)."""


# ====================================================================== runs and labels
def as_runs(runs: Runs) -> list[Measurement]:
    """One Measurement or a sequence of them -> a non-empty list."""
    out = [runs] if isinstance(runs, Measurement) else list(runs)
    if not out:
        raise BlockCouplingError("no measurement given: pass one Measurement or a list of them")
    return out


def run_label(m: Measurement, index: int = 0) -> str:
    """A short name for a run: meta ``label``, else ``revision``, else the model id."""
    for key in ("label", "revision", "model"):
        value = m.meta.get(key)
        if value not in (None, ""):
            return str(value)
    return f"run {index + 1}"


def run_labels(ms: Sequence[Measurement], labels: Sequence[str] | None = None) -> list[str]:
    """Labels for several runs; explicit ``labels`` win. Duplicates get a suffix #i."""
    if labels is not None:
        if len(labels) != len(ms):
            raise BlockCouplingError(
                f"{len(labels)} labels for {len(ms)} runs: give one label per run"
            )
        out = [str(x) for x in labels]
    else:
        out = [run_label(m, i) for i, m in enumerate(ms)]
    seen: dict[str, int] = {}
    for i, lab in enumerate(out):
        if out.count(lab) > 1:
            seen[lab] = seen.get(lab, 0) + 1
            out[i] = f"{lab} #{seen[lab]}"
    return out


def n_prompts(m: Measurement) -> int:
    """Number of prompts of a run (prompts table, else distinct prompt ids in any table)."""
    if len(m.prompts):
        return int(m.prompts["prompt_id"].nunique())
    ids: set[str] = set()
    for name in ("coupling", "trajectory", "token_metrics", "spectra"):
        ids.update(str(v) for v in m.table(name)["prompt_id"].dropna().unique())
    return len(ids)


def is_empty(m: Measurement) -> bool:
    """True when no result table of the run has a row (nothing was measured)."""
    return all(m.table(name).empty for name in TABLES if name not in ("prompts", "diagnostics"))


def n_layers(m: Measurement) -> int | None:
    """Number of blocks L seen in the run's tables (trajectory layers 0..L, else coupling)."""
    if not m.trajectory.empty:
        return int(m.trajectory["layer"].max())
    if not m.coupling.empty:
        return int(max(m.coupling["layer_a"].max(), m.coupling["layer_b"].max()))
    if not m.spectra.empty:
        return int(m.spectra["layer"].max())
    return None


def resolve_k(m: Measurement, k: int | None) -> int:
    """The K a summary uses for run ``m``: ``k`` or the run's smallest measured K."""
    return int(k) if k is not None else int(min(m.config.k))


def check_variant(variant: str, orientation: str) -> None:
    """Raise a clear error for an unknown variant or orientation."""
    if variant not in HIGHER_IS_COUPLED:
        raise BlockCouplingError(
            f"variant {variant!r} is unknown; choose from {', '.join(HIGHER_IS_COUPLED)}"
        )
    if orientation not in ("ujv", "vju"):
        raise BlockCouplingError(f"orientation {orientation!r} is unknown; choose ujv or vju")


# ====================================================================== robust statistics
@dataclass(frozen=True)
class RobustStats:
    """Summary of one sample: counts, quartiles, mean and range (NaN values counted apart)."""

    n: int  # finite values
    n_nan: int  # NaN values (not measured or undefined)
    median: float
    q25: float
    q75: float
    mean: float
    min: float
    max: float

    @property
    def iqr(self) -> float:
        return self.q75 - self.q25

    def spans_decades(self, decades: float = 2.0) -> bool:
        """True when the positive values span more than ``decades`` powers of ten."""
        return self.min > 0 and self.max / self.min > 10.0 ** decades


def robust_stats(values: Sequence[float] | np.ndarray | pd.Series) -> RobustStats:
    """:class:`RobustStats` of ``values`` (NaN and +-inf are counted in ``n_nan``)."""
    v = np.asarray(values, dtype=float).ravel()
    finite = v[np.isfinite(v)]
    if finite.size == 0:
        nan = float("nan")
        return RobustStats(0, int(v.size), nan, nan, nan, nan, nan, nan)
    q25, med, q75 = np.quantile(finite, [0.25, 0.5, 0.75])
    return RobustStats(int(finite.size), int(v.size - finite.size), float(med), float(q25),
                       float(q75), float(finite.mean()), float(finite.min()),
                       float(finite.max()))


def token_metric_stats(m: Measurement, column: str, token: int | None = None) -> RobustStats:
    """:class:`RobustStats` over (prompt, token) of a ``token_metrics`` column (``lss``,
    ``expodistance``, ``equidistance_cv``, ``linearisation_cosine``)."""
    tm = m.token_metrics if token is None else m.token_metrics[m.token_metrics["token"] == token]
    return robust_stats(tm[column])


# ====================================================================== depth-wise coupling
def depth_rows(m: Measurement, k: int | None, variant: str, p: float | None,
               orientation: str) -> pd.DataFrame | None:
    """The run's depth-wise rows for one selection, or None where none were measured."""
    try:
        return m.select("depth", resolve_k(m, k), variant, p, orientation)
    except KeyError:
        return None


def why_no_depth(m: Measurement, k: int | None, variant: str, p: float | None,
                 orientation: str) -> str:
    """The message of the failed selection (says what was measured)."""
    try:
        m.select("depth", resolve_k(m, k), variant, p, orientation)
    except KeyError as err:
        return str(err.args[0]) if err.args else "no depth-wise coupling rows"
    return "no depth-wise coupling rows for this selection"


def depth_matrix(m: Measurement, *, k: int | None = None, variant: str = "coupling",
                 p: float | None = 1.0, orientation: str = "ujv",
                 token: int | None = None) -> pd.DataFrame | None:
    """L x L mean depth-wise matrix of one run (rows = measured layer_a, columns = basis
    layer_b, mean over prompts and tokens), or None where not measured."""
    if depth_rows(m, k, variant, p, orientation) is None:
        return None
    mat = m.depth_matrix(token=token, k=resolve_k(m, k), variant=variant, p=p,
                         orientation=orientation)
    return None if mat.empty else mat


def depth_matrices(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                   p: float | None = 1.0, orientation: str = "ujv",
                   token: int | None = None) -> list[pd.DataFrame | None]:
    """Per run: :func:`depth_matrix` (None where absent); :class:`NoData` if no run has it."""
    check_variant(variant, orientation)
    ms = as_runs(runs)
    mats = [depth_matrix(m, k=k, variant=variant, p=p, orientation=orientation, token=token)
            for m in ms]
    if all(x is None for x in mats):
        raise NoData(why_no_depth(ms[0], k, variant, p, orientation))
    return mats


def has_variant(m: Measurement, variant: str, kind: str = "depth") -> bool:
    """True when the run has rows of ``variant`` for ``kind``."""
    c = m.coupling
    return bool(((c["kind"] == kind) & (c["variant"] == variant)).any())


def chance_coupling_rows(m: Measurement, *, k: int | None = None, p: float | None = 1.0,
                         orientation: str = "ujv") -> pd.DataFrame | None:
    """Depth-wise off-diagonal rows with the raw coupling ``c``, ``coupling_vs_null`` ``v``
    and the chance coupling ``c_null`` of the same Jacobian pair.

    From v = 1 - m / m_null and m = 1 - c: ``c_null = 1 - (1 - c) / (1 - v)``. Rows with
    v = 1 (perfect coupling, c_null undefined) are dropped. None when either variant is
    missing. Columns: prompt_id, token, layer_a, layer_b, coupling, coupling_vs_null,
    chance_coupling."""
    raw = depth_rows(m, k, "coupling", p, orientation)
    rel = depth_rows(m, k, "coupling_vs_null", p, orientation)
    if raw is None or rel is None:
        return None
    keys = ["prompt_id", "token_out_a", "layer_a", "layer_b"]
    both = raw[keys + ["value"]].merge(rel[keys + ["value"]], on=keys,
                                       suffixes=("_c", "_v"))
    both = both[(both["layer_a"] != both["layer_b"]) & (both["value_v"] < 1.0)]
    out = both.rename(columns={"token_out_a": "token", "value_c": "coupling",
                               "value_v": "coupling_vs_null"})
    out["chance_coupling"] = 1.0 - (1.0 - out["coupling"]) / (1.0 - out["coupling_vs_null"])
    return out.reset_index(drop=True)


def coupling_by_distance(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                         p: float | None = 1.0,
                         orientation: str = "ujv") -> list[pd.DataFrame | None]:
    """Locality per run: the depth-wise value against layer distance |l - l'|.

    One frame per run (None where absent) with columns distance, mean, std, median, q25, q75,
    count, over every (prompt, token, layer pair) at that distance."""
    check_variant(variant, orientation)
    ms = as_runs(runs)
    out: list[pd.DataFrame | None] = []
    for m in ms:
        rows = depth_rows(m, k, variant, p, orientation)
        if rows is None:
            out.append(None)
            continue
        dist = (rows["layer_a"] - rows["layer_b"]).abs().rename("distance")
        g = rows["value"].groupby(dist)
        out.append(pd.DataFrame({
            "mean": g.mean(), "std": g.std(), "median": g.median(),
            "q25": g.quantile(0.25), "q75": g.quantile(0.75), "count": g.size(),
        }).reset_index())
    if all(t is None for t in out):
        raise NoData(why_no_depth(ms[0], k, variant, p, orientation))
    return out


def layer_graph_weights(matrix: pd.DataFrame) -> dict[tuple[int, int], float]:
    """Edge value for each pair of layers l < l': the mean of M[l, l'] and M[l', l]
    (coupling is not symmetric; the graph is), over the entries that were measured."""
    layers = sorted(set(matrix.index) | set(matrix.columns))
    out: dict[tuple[int, int], float] = {}
    for i, a in enumerate(layers):
        for b in layers[i + 1:]:
            vals = [float(matrix.loc[x, y]) for x, y in ((a, b), (b, a))
                    if x in matrix.index and y in matrix.columns
                    and not pd.isna(matrix.loc[x, y])]
            if vals:
                out[(int(a), int(b))] = float(np.mean(vals))
    return out


def edge_strength(values: np.ndarray | Sequence[float], variant: str) -> np.ndarray:
    """Map edge values to [0, 1] on a FIXED scale, never the data's range, so that a model at
    the chance level looks unstructured whatever its spread.

    ``coupling_vs_null``: 0 = the chance level, 1 = perfect coupling (clipped). ``coupling``:
    the value itself (0 = no coupling, 1 = perfect; chance is above 0). Lower-is-coupled
    variants (``miscoupling``, ``released_*``, ``offdiag_ratio``): 1 - value."""
    v = np.asarray(values, dtype=float)
    s = v if HIGHER_IS_COUPLED[variant] else 1.0 - v
    return np.clip(s, 0.0, 1.0)


# ====================================================================== |A| grids
@dataclass(frozen=True)
class GridPick:
    """What the coupling-matrix grid draws for one run."""

    prompt_id: str
    key: str
    layers: tuple[int, ...]  # the window's layer numbers (1-based)
    k: int
    mosaic: np.ndarray  # (W*k + (W-1)*gap, same); NaN in the gaps; each cell |A| / max|A|
    gap: int


def _figure_window(m: Measurement, width: int) -> tuple[int, ...] | None:
    win = m.meta.get("figure_window") or m.config.figure_window
    if win is None:
        return None
    first, last = int(win[0]), int(win[1])
    # measure() keeps the selected layers inside the window (``layers`` may skip some)
    chosen = m.config.layers
    layers = (tuple(range(first, last + 1)) if chosen is None
              else tuple(x for x in chosen if first <= x <= last))
    if len(layers) != width:
        raise BlockCouplingError(
            f"figure_window {first}..{last} holds {len(layers)} measured layers but the stored "
            f"coupling arrays have {width}; the run directory is inconsistent, re-run it"
        )
    return layers


def grid_mosaic(A: np.ndarray, k: int) -> tuple[np.ndarray, int]:
    """Tile |A[i, j, :k, :k]| (each normalised by its own max) into one image.

    ``A``: (W, W, Kmax, Kmax), first index = measured layer, second = basis layer. Returns the
    mosaic (W*k + (W-1)*gap, W*k + (W-1)*gap) with NaN between cells, and the gap."""
    W = A.shape[0]
    gap = max(1, k // 4)
    size = W * k + (W - 1) * gap
    out = np.full((size, size), np.nan)
    for i in range(W):
        for j in range(W):
            cell = np.abs(np.asarray(A[i, j, :k, :k], dtype=float))  # (k, k)
            top = cell.max()
            if top > 0:
                cell = cell / top
            r, c = i * (k + gap), j * (k + gap)
            out[r:r + k, c:c + k] = cell
    return out, gap


def coupling_grid_data(runs: Runs, *, prompt_id: str | None = None, k: int | None = None,
                       orientation: str = "ujv") -> list[GridPick | None]:
    """Per run: the prompt, window and mosaic of the stored coupling matrices A."""
    check_variant("coupling", orientation)
    picks: list[GridPick | None] = []
    for m in as_runs(runs):
        keys = [key for key in m.arrays
                if key.startswith("A/") and key.endswith(f"/{orientation}")]
        if not keys:
            picks.append(None)
            continue
        if prompt_id is not None:
            key = f"A/{prompt_id}/{orientation}"
            if key not in m.arrays:
                picks.append(None)
                continue
        else:
            order = [f"A/{pid}/{orientation}" for pid in m.prompts["prompt_id"]]
            key = next((x for x in order if x in m.arrays), sorted(keys)[0])
        A = np.asarray(m.arrays[key])  # (W, W, Kmax, Kmax)
        if A.ndim != 4 or A.shape[0] != A.shape[1] or A.shape[2] != A.shape[3]:
            raise BlockCouplingError(
                f"array {key!r} has shape {A.shape}; expected (W, W, K, K)"
            )
        kk = A.shape[2] if k is None else min(int(k), A.shape[2])
        layers = _figure_window(m, A.shape[0]) or tuple(range(1, A.shape[0] + 1))
        mosaic, gap = grid_mosaic(A, kk)
        picks.append(GridPick(key.split("/", 1)[1].rsplit("/", 1)[0], key, layers, kk,
                              mosaic, gap))
    if all(x is None for x in picks):
        raise NoData(
            f"no coupling matrices stored (arrays 'A/<prompt>/{orientation}'); measure with "
            "figure_window set to keep them"
        )
    return picks


# ====================================================================== token-wise coupling
@dataclass(frozen=True)
class TokenPick:
    """What the token-wise heatmap draws for one run."""

    kind: str
    prompt_id: str
    layer_a: int
    layer_b: int
    fixed: int | None  # the fixed input (fixed_input) or output (fixed_output) token
    matrix: pd.DataFrame  # rows = side-a token, columns = side-b token


def token_axes(kind: str) -> tuple[str, str, str | None]:
    """(row column, column column, fixed-token column) of the pivot for a token-wise kind."""
    if kind == "self":
        return "token_out_a", "token_out_b", None
    if kind == "fixed_input":
        return "token_out_a", "token_out_b", "token_in_a"
    if kind == "fixed_output":
        return "token_in_a", "token_in_b", "token_out_a"
    raise BlockCouplingError(f"token-wise kind {kind!r}: choose from {', '.join(TOKEN_KINDS)}")


def _token_pick(m: Measurement, kind: str, *, prompt_id: str | None,
                layers: tuple[int, int] | None, fixed_token: int | None, k: int | None,
                variant: str, p: float | None, orientation: str) -> TokenPick | None:
    row, col, fixed_col = token_axes(kind)
    try:
        df = m.select(kind, resolve_k(m, k), variant, p, orientation)
    except KeyError:
        return None
    if prompt_id is None:
        order = [pid for pid in m.prompts["prompt_id"] if (df["prompt_id"] == pid).any()]
        prompt_id = order[0] if order else str(df["prompt_id"].iloc[0])
    df = df[df["prompt_id"] == prompt_id]
    if df.empty:
        return None
    if layers is None:
        pairs = sorted({(int(a), int(b)) for a, b in zip(df["layer_a"], df["layer_b"],
                                                          strict=True)})
        same = [pr for pr in pairs if pr[0] == pr[1]]
        layers = same[len(same) // 2] if same else pairs[0]
    df = df[(df["layer_a"] == layers[0]) & (df["layer_b"] == layers[1])]
    fixed = None
    if fixed_col is not None:
        other = fixed_col.replace("_a", "_b")
        df = df[df[fixed_col] == df[other]]
        if df.empty:
            return None
        if fixed_token is None:
            # fixed_input: the first input token (sees every output); fixed_output: the last.
            fixed = int(df[fixed_col].min() if kind == "fixed_input" else df[fixed_col].max())
        else:
            fixed = int(fixed_token)
        df = df[df[fixed_col] == fixed]
    if df.empty:
        return None
    matrix = df.pivot_table(index=row, columns=col, values="value", aggfunc="mean")
    return TokenPick(kind, str(prompt_id), int(layers[0]), int(layers[1]), fixed, matrix)


def token_heatmap_data(runs: Runs, kind: str = "self", *, prompt_id: str | None = None,
                       layers: tuple[int, int] | None = None, fixed_token: int | None = None,
                       k: int | None = None, variant: str = "coupling",
                       p: float | None = 1.0, orientation: str = "ujv") -> list[TokenPick | None]:
    """Per run: the prompt, layer pair, fixed token and n x n token-wise matrix.

    Defaults: the run's first prompt, the middle same-layer pair, for ``fixed_input`` the
    first input token and for ``fixed_output`` the last output token."""
    check_variant(variant, orientation)
    token_axes(kind)
    picks = [_token_pick(m, kind, prompt_id=prompt_id, layers=layers, fixed_token=fixed_token,
                         k=k, variant=variant, p=p, orientation=orientation)
             for m in as_runs(runs)]
    if all(x is None for x in picks):
        raise NoData(f"no '{kind}' coupling rows for this selection; measure with "
                     f"coupling including {kind!r}")
    return picks


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
    """The least-squares fit ``sigma ~ a / l + b`` of one run's :func:`top_singular_values`."""

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
    """:func:`blockcoupling.engine.spectra.fit_inverse_depth` on a :func:`top_singular_values`
    table (None with fewer than 3 layers)."""
    if len(table) < 3:
        return None
    x = table["layer"].to_numpy(dtype=float)
    fit = fit_inverse_depth(x, table["sigma"].to_numpy(dtype=float))
    pos = tuple(int(v) for v in x if fit["a"] / v + fit["b"] > 0)
    return InverseDepthFit(float(fit["a"]), float(fit["b"]), float(fit["r2"]), int(fit["n"]),
                           pos, len(x))


# ====================================================================== across runs
def across_runs_data(runs: Runs, *, k: int | None = None, variant: str = "coupling",
                     p: float | None = 1.0, orientation: str = "ujv") -> pd.DataFrame:
    """One row per run (in order) with, over prompts and tokens:

    - ``coupling_*``: the depth-wise value of ``variant`` (mean, std, median, q25, q75 of the
      per-prompt values of the headline rule, ``engine.statistic``);
    - ``null_*``: the same for ``coupling_vs_null`` (NaN where not measured);
    - ``lss_*`` and ``expodistance_*``: mean, std, median, q25, q75 and ``_nan`` (count of
      tokens without a value) of the per-token metrics.

    Expodistance is heavy-tailed where norms barely grow (post-LN models): read medians."""
    check_variant(variant, orientation)
    rows = []
    for m in as_runs(runs):
        row: dict[str, float] = {}
        for name, var in (("coupling", variant), ("null", "coupling_vs_null")):
            vals: pd.Series | None = None
            if depth_rows(m, k, var, p, orientation) is not None:
                vals = m.per_prompt_coupling(resolve_k(m, k), variant=var, p=p,
                                             orientation=orientation)["value"]
            st = robust_stats([] if vals is None else vals)
            row[f"{name}_mean"] = st.mean
            row[f"{name}_std"] = float(vals.std(ddof=0)) if vals is not None and len(vals) \
                else float("nan")
            row[f"{name}_median"], row[f"{name}_q25"], row[f"{name}_q75"] = (
                st.median, st.q25, st.q75)
        for col in ("lss", "expodistance"):
            v = m.token_metrics[col]
            st = robust_stats(v)
            row[f"{col}_mean"] = st.mean
            row[f"{col}_std"] = float(v.dropna().std(ddof=0)) if st.n else float("nan")
            row[f"{col}_median"], row[f"{col}_q25"], row[f"{col}_q75"] = (
                st.median, st.q25, st.q75)
            row[f"{col}_nan"] = float(st.n_nan)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out[["coupling_mean", "lss_mean", "expodistance_mean"]].isna().all().all():
        raise NoData("no depth-wise coupling and no trajectory metrics to compare")
    return out


def run_overview(runs: Runs, labels: Sequence[str] | None = None, *, k: int | None = None,
                 p: float | None = 1.0, orientation: str = "ujv") -> pd.DataFrame:
    """One row per run: what was measured and the headline numbers (the report's summary).

    Columns: label, model, n_prompts, n_layers, k, measured (False: no table has a row),
    kinds (comma-separated coupling kinds present), the headline statistic
    (``engine.statistic``: ``coupling_vs_null_mean``, ``coupling_vs_null_se``,
    ``coupling_mean``, ``coupling_se``, ``coupling_chance``, ``statistic_rule``),
    vs_null_median / vs_null_q25 / vs_null_q75 / vs_null_min / vs_null_max (of the per-prompt
    values of ``coupling_vs_null``), vs_null_n (how many prompts), lss_median,
    expodistance_median, expodistance_q25, expodistance_q75, expodistance_nan, n_tokens
    (rows of token_metrics). NaN where not measured."""
    ms = as_runs(runs)
    labs = run_labels(ms, labels)
    rows: list[dict[str, Any]] = []
    for m, lab in zip(ms, labs, strict=True):
        kk = resolve_k(m, k) if m.config.k else None
        row: dict[str, Any] = {
            "label": lab, "model": str(m.meta.get("model", "")), "n_prompts": n_prompts(m),
            "n_layers": n_layers(m), "k": kk, "measured": not is_empty(m),
            "kinds": ", ".join(sorted(set(m.coupling["kind"].dropna().astype(str)))),
        }
        row.update(headline_columns(m, kk, p=p, orientation=orientation))
        rel = None
        if depth_rows(m, kk, "coupling_vs_null", p, orientation) is not None:
            rel = m.per_prompt_coupling(kk, variant="coupling_vs_null", p=p,
                                        orientation=orientation)["value"]
        st = robust_stats([] if rel is None else rel)
        row.update(vs_null_median=st.median, vs_null_q25=st.q25, vs_null_q75=st.q75,
                   vs_null_min=st.min, vs_null_max=st.max, vs_null_n=st.n)
        lss = token_metric_stats(m, "lss")
        ed = token_metric_stats(m, "expodistance")
        row.update(lss_median=lss.median, expodistance_median=ed.median,
                   expodistance_q25=ed.q25, expodistance_q75=ed.q75,
                   expodistance_max=ed.max, expodistance_nan=ed.n_nan,
                   n_tokens=len(m.token_metrics))
        rows.append(row)
    return pd.DataFrame(rows)


def headline_columns(m: Measurement, k: int | None, *, p: float | None = 1.0,
                     orientation: str = "ujv") -> dict[str, Any]:
    """The headline statistic of a run in wide form (NaN for a variant it did not measure):
    ``coupling_vs_null_mean, coupling_vs_null_se, coupling_mean, coupling_se,
    coupling_chance, statistic_rule``."""
    nan = float("nan")
    out: dict[str, Any] = {"coupling_vs_null_mean": nan, "coupling_vs_null_se": nan,
                           "coupling_mean": nan, "coupling_se": nan, "coupling_chance": nan,
                           "statistic_rule": ""}
    for variant in HEADLINE_VARIANTS:
        if k is None or depth_rows(m, k, variant, p, orientation) is None:
            continue
        try:
            t = m.coupling_statistic(variants=(variant,), k=k, p=p, orientation=orientation,
                                     n_boot=0)
        except BlockCouplingError:
            continue
        r = t.iloc[0]
        out[f"{variant}_mean"], out[f"{variant}_se"] = float(r["mean"]), float(r["se"])
        if variant == "coupling":
            out["coupling_chance"] = float(r["chance"])
        out["statistic_rule"] = out["statistic_rule"] or str(r["rule"])
    return out


def per_prompt_vs_null(m: Measurement, *, k: int | None = None, p: float | None = 1.0,
                       orientation: str = "ujv") -> pd.Series | None:
    """The per-prompt values of ``coupling_vs_null`` by the headline rule (None if absent)."""
    if depth_rows(m, k, "coupling_vs_null", p, orientation) is None:
        return None
    return m.per_prompt_coupling(resolve_k(m, k), variant="coupling_vs_null", p=p,
                                 orientation=orientation)["value"].dropna()


def config_differences(a: Measurement, b: Measurement) -> dict[str, tuple[Any, Any]]:
    """Configuration fields (and scalar ``extra`` entries) whose values differ between two
    runs: name -> (value in a, value in b). Lets the report say what separates two views of
    one model (e.g. ``final_norm``) without knowing the option's name in advance."""
    da, db = a.config.to_dict(), b.config.to_dict()
    ea, eb = da.pop("extra", {}) or {}, db.pop("extra", {}) or {}
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(da) | set(db)):
        if key in ("batch_size", "chunk_size", "analysis_device", "figure_prompts",
                   "figure_window", "seed"):
            continue  # do not change a number
        if da.get(key) != db.get(key):
            out[key] = (da.get(key), db.get(key))
    for key in sorted(set(ea) | set(eb)):
        if ea.get(key) != eb.get(key):
            out[f"extra.{key}"] = (ea.get(key), eb.get(key))
    return out


def fmt_number(value: Any, digits: int = 3) -> str:
    """A number for people: ``digits`` significant digits, thousands separators for large
    values, scientific notation for tiny or huge ones, '-' for None / NaN, 'inf' for inf."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer):
        return f"{int(value):,}"
    if isinstance(value, float | np.floating):
        v = float(value)
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == 0:
            return "0"
        if abs(v) >= 1e6 or abs(v) < 1e-3:
            return f"{v:.{digits}g}"
        if abs(v) >= 10 ** digits:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(value)


__all__ = [
    "CHANCE_BAND", "EXPODISTANCE_NAN_REASON", "HIGHER_IS_COUPLED", "P_VARIANTS", "TOKEN_KINDS",
    "GridPick", "InverseDepthFit", "NoData", "RobustStats", "Runs", "TokenPick",
    "across_runs_data", "as_runs", "chance_coupling_rows", "check_variant", "headline_columns",
    "config_differences", "coupling_by_distance", "coupling_grid_data", "depth_matrices",
    "depth_matrix", "depth_rows", "edge_strength", "fmt_number", "grid_mosaic", "has_variant",
    "inverse_depth_fit", "is_empty", "layer_graph_weights", "n_layers", "n_prompts", "pca_data",
    "per_prompt_vs_null", "resolve_k", "robust_stats", "run_label", "run_labels",
    "run_overview", "token_axes", "token_heatmap_data", "token_metric_stats",
    "top_singular_values", "trajectory_summary", "why_no_depth", "window_covers_model",
]
