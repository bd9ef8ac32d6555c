"""Coupling across runs: run A's Jacobians in run B's top-K bases, and the principal angles
between their top-K subspaces (checkpoint vs final, base vs fine-tuned, seed vs seed).

For every prompt, token t and pair of layers (l, l'): ``c_K(J^{A,l}_tt, J^{B,l'}_tt)``, the
coupling of run A's Jacobian at layer l in the top-K singular vectors of run B's at layer l'
(``A = U_B^T J_A V_B``, every variant / p / K as in the ``coupling`` table: the same
``metrics`` and ``tables.coupling_rows``), and the cosines of the principal angles between
A's and B's top-K left (U) and right (V) subspaces.

What it needs: run B's bases (``save_bases``) and run A's Jacobians themselves
(``save_jacobians``; a top-K truncation of J_A would change the coupling). Where run A did
not store them, pass ``model_a`` (and its tokenizer): A's prompts are measured again in
memory with A's own settings and ``save_jacobians`` (its weights hash is checked against
the run's). ``cross_coupling(run, run)`` is the run's own depth-wise coupling. The two runs'
prompts are joined by their text (``studies.joins.match_prompts``), never by their ids: one
id of another text in the two runs is refused, and the same texts under other ids are
compared.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from blockcoupling.engine import bases as eb
from blockcoupling.engine import metrics, svd, tables
from blockcoupling.engine.results import Measurement, conform
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries import REPORT_RULE
from blockcoupling.studies import joins

RunLike = Measurement | str | os.PathLike[str]
ANGLE_COLUMNS = ("run_a", "run_b", "prompt_id", "layer_a", "layer_b", "token", "k", "side",
                 "rank", "cosine")


@dataclass
class CrossCoupling:
    """``coupling``: the ``coupling`` table's columns (kind ``depth``: side a = run A's
    Jacobian, side b = run B's basis) plus ``run_a``, ``run_b``; ``angles``: one row per
    (prompt, layer_a, layer_b, token, k, side U/V, rank) with the principal angle's cosine."""

    coupling: pd.DataFrame
    angles: pd.DataFrame

    def matrix(self, rule: StatisticRule = REPORT_RULE) -> pd.DataFrame:
        """layer_a x layer_b mean over prompts and tokens (rows: run A's layer) of the rule's
        variant, K (None: the smallest measured), p and orientation."""
        df = self.coupling
        variant, p, orientation = rule.variant, rule.p, rule.orientation
        k = int(df["k"].min()) if rule.k is None else int(rule.k)
        sel = (df["k"] == k) & (df["variant"] == variant) & (df["orientation"] == orientation)
        if p is not None and df.loc[sel, "p"].notna().any():
            sel &= df["p"] == float(p)
        if not sel.any():
            raise BlockCouplingError(
                f"no cross-coupling rows for k={k}, variant={variant}, p={p}, "
                f"orientation={orientation}")
        return df[sel].pivot_table(index="layer_a", columns="layer_b", values="value",
                                   aggfunc="mean")


    def angle_matrix(self, *, k: int | None = None) -> pd.DataFrame:
        """layer_a x layer_b mean principal-angle cosine (U and V, every rank, prompt, token)."""
        k = int(self.angles["k"].min()) if k is None else k
        return self.angles[self.angles["k"] == k].pivot_table(
            index="layer_a", columns="layer_b", values="cosine", aggfunc="mean")

    def summary(self, rule: StatisticRule = REPORT_RULE) -> str:
        """A few lines: the runs, and per run pair the mean coupling and cosine of the same
        layer (l = l') and of the others."""
        lines = []
        for (ra, rb), df in self.coupling.groupby(["run_a", "run_b"], sort=False):
            sub = CrossCoupling(df, self.angles[(self.angles["run_a"] == ra)
                                                & (self.angles["run_b"] == rb)])
            mat = sub.matrix(rule)
            ang = sub.angle_matrix(k=rule.k if isinstance(rule.k, int) else None)
            same = np.diag(mat.to_numpy()).mean()
            off = mat.to_numpy()[~np.eye(len(mat), dtype=bool)].mean() if len(mat) > 1 else np.nan
            lines.append(f"{ra} in the bases of {rb}: same layer {same:.4f}, other layers "
                         f"{off:.4f}; principal-angle cosine (same layer) "
                         f"{np.diag(ang.to_numpy()).mean():.4f}")
        return "\n".join(lines)

    def to_dict(self, rule: StatisticRule = REPORT_RULE) -> dict[str, Any]:
        """Both tables (records) and the layer x layer matrices (``--json``), in the one JSON
        dialect of every output (``jsonsafe``: a missing value is null)."""
        from blockcoupling.jsonsafe import jsonable

        mats = {f"{ra} | {rb}": CrossCoupling(df, self.angles).matrix(rule)
                for (ra, rb), df in self.coupling.groupby(["run_a", "run_b"], sort=False)}
        data = {"matrices": {name: {"layers_a": list(m.index), "layers_b": list(m.columns),
                                    "values": m.to_numpy().tolist()}
                             for name, m in mats.items()},
                "coupling": self.coupling.to_dict(orient="records"),
                "angles": self.angles.to_dict(orient="records")}
        return dict(jsonable(data))

    def to_json(self, path: str | os.PathLike[str], rule: StatisticRule = REPORT_RULE) -> Path:
        """[`to_dict`][blockcoupling.studies.cross.CrossCoupling.to_dict] written to ``path``
        (its folders made), as every JSON output is (``store.fileio.write_json``)."""
        from blockcoupling.store.fileio import write_json

        return write_json(Path(path), self.to_dict(rule))


def _open(run: RunLike) -> tuple[Measurement, str]:
    if isinstance(run, Measurement):
        return run, str(run.meta.get("run_dir") or run.meta.get("model") or "run")
    from blockcoupling.store.reader import open_run

    return open_run(run), str(Path(run))


def _diagonal_keys(m: Measurement, parts: Sequence[str]) -> dict[str, list[eb.BasisKey]]:
    """Per prompt: its stored J^l_tt keys that hold ``parts``."""
    src = m.basis_store
    out: dict[str, list[eb.BasisKey]] = {}
    for pid in m.prompts["prompt_id"].astype(str):
        keys = [k for k in (src.keys(pid) if src is not None else []) if k[2] == k[3]]
        out[pid] = [k for k in keys if all(p in src.load(k) for p in parts)]  # type: ignore[union-attr]
    return out


def _with_jacobians(a: Measurement, model: Any, tokenizer: Any, inputs: Any) -> Measurement:
    """Run A with its Jacobians: as stored, or measured again in memory with ``model`` (on
    run A's text prompts with ``tokenizer``, or on ``inputs``, its ready-made inputs)."""
    if a.basis_store is not None and any(eb.JACOBIAN in a.basis_store.load(k)
                                         for k in a.basis_store.keys()[:1]):
        return a
    if model is None:
        raise BlockCouplingError(
            "run A stores no Jacobians: measure it with save_jacobians=True (CLI: "
            "--save-jacobians), or pass model_a (and tokenizer_a) to measure them again")
    from blockcoupling.engine.measure import measure
    from blockcoupling.store.fingerprint import weights_hash

    joins.same_weights(a.meta.get("weights_hash"), weights_hash(model),
                       what="model_a is not the model run A measured; pass the model run A "
                       "was measured with")
    if inputs is None and tokenizer is None:
        raise BlockCouplingError(
            "measuring run A again needs its prompts: pass tokenizer_a (text prompts) or "
            "inputs_a (the ready-made inputs it measured)")
    prompts = inputs if inputs is not None else list(zip(
        a.prompts["prompt_id"].astype(str), a.prompts["text"].astype(str), strict=True))
    cfg = a.config.replace(save_jacobians=True, save_bases=True)
    again = measure(model, tokenizer, prompts, config=cfg, progress=False)
    joins.match_prompts(again.prompts, a.prompts, names=("inputs_a", "run A"))
    again.meta = a.meta
    return again


def _check_grid(a: Measurement, b: Measurement, ka: dict[str, list[eb.BasisKey]],
                kb: dict[str, list[eb.BasisKey]]) -> dict[str, str]:
    """Run A's prompt ids -> run B's of the same text (``joins.match_prompts``: the prompts
    are joined by their content, not their ids), each pair measured at the same layers and
    tokens; else one line saying what differs."""
    pairs = joins.match_prompts(a.prompts, b.prompts)
    for pid, qid in pairs.items():
        grid_a = {(k[1], k[2]) for k in ka.get(pid, [])}
        grid_b = {(k[1], k[2]) for k in kb.get(qid, [])}
        if grid_a != grid_b:
            def show(g: set[tuple[int, int]]) -> str:
                return (f"layers {sorted({x[0] for x in g}) or '-'}, tokens "
                        f"{sorted({x[1] for x in g}) or '-'}")
            raise BlockCouplingError(
                f"prompt {pid!r}: run A has {show(grid_a)}, run B {show(grid_b)}; measure both "
                "with the same layers and tokens")
    da, db = a.meta.get("hidden_size"), b.meta.get("hidden_size")
    if da is not None and db is not None and da != db:
        raise BlockCouplingError(f"hidden sizes differ (run A d={da}, run B d={db})")
    return pairs


def cross_coupling(run_a: RunLike, run_b: RunLike, *, k: int | Sequence[int] | None = None,
                   variant: str | Sequence[str] | None = None, p: Any = None,
                   orientation: str | Sequence[str] | None = None, model_a: Any = None,
                   tokenizer_a: Any = None, inputs_a: Any = None, labels: tuple[str, str] | None = None
                   ) -> CrossCoupling:
    """Run A's depth-wise Jacobians J^{A,l}_tt in run B's top-K bases U, V of J^{B,l'}_tt,
    for every prompt, measured token and layer pair; plus the principal angles between the
    two runs' top-K subspaces. ``k``, ``variant``, ``p``, ``orientation`` default to run A's
    settings (K limited to run B's largest K)."""
    a, name_a = _open(run_a)
    b, name_b = _open(run_b)
    name_a, name_b = labels or (name_a, name_b)
    kb = _diagonal_keys(b, eb.PARTS)
    if not any(kb.values()):
        raise BlockCouplingError("run B stores no bases: measure it with save_bases=True "
                                 "(CLI: --save-bases)")
    a = _with_jacobians(a, model_a, tokenizer_a, inputs_a)
    ka = _diagonal_keys(a, (eb.JACOBIAN,))
    pairs = _check_grid(a, b, ka, kb)
    kmax_b = min(int(b.basis_store.load(keys[0])["U"].shape[-1])  # type: ignore[union-attr]
                 for keys in kb.values() if keys)
    ks = tuple(a.config.k) if k is None else tuple(np.atleast_1d(k).tolist())
    ks = tuple(x for x in ks if x <= kmax_b)
    if not ks:
        raise BlockCouplingError(f"run B stores bases of K = {kmax_b}; ask for k <= {kmax_b}")
    cfg = a.config.replace(k=ks, **{name: value for name, value in (
        ("variants", variant), ("p", p), ("orientations", orientation)) if value is not None})
    frames, angles = [], []
    for pid, keys in ka.items():
        jac = {key: eb.factors(a.basis_store, key, (eb.JACOBIAN,))[0] for key in keys}
        bas = {key: eb.factors(b.basis_store, key, eb.PARTS) for key in kb[pairs[pid]]}
        tops = {key[1:]: svd.topk_svd(J, max(ks)) for key, J in jac.items()}
        A_store: dict[tuple[str, Any, Any, str], torch.Tensor] = {}
        for key_a, J in jac.items():
            same_t = [kb_ for kb_ in kb[pairs[pid]] if kb_[2:] == key_a[2:]]
            Ub = torch.stack([bas[x][0] for x in same_t]).to(J.dtype)  # (P, d, Kb)
            Vb = torch.stack([bas[x][2] for x in same_t]).to(J.dtype)  # (P, d, Kb)
            for orient in cfg.orientations:
                As = metrics.coupling_matrix(J, Ub, Vb, orient)  # (P, Kb, Kb)
                for x, Ab in zip(same_t, As, strict=True):
                    A_store[("depth", key_a[1:], x[1:], orient)] = Ab[:max(ks), :max(ks)]
            Ua, Va = tops[key_a[1:]].U, tops[key_a[1:]].V
            for x in same_t:
                for side, X, Y in (("U", Ua, bas[x][0]), ("V", Va, bas[x][2])):
                    for kk in ks:
                        cos = torch.linalg.svdvals(X[:, :kk].mT.double() @ Y[:, :kk].double())
                        angles.append(pd.DataFrame({
                            "prompt_id": pid, "layer_a": key_a[1], "layer_b": x[1],
                            "token": key_a[2], "k": kk, "side": side,
                            "rank": np.arange(1, kk + 1), "cosine": cos.numpy()}))
        # the bases are run B's: their U^T V (for the rotated null) from B's stored factors
        overlaps = {x[1:]: bas[x][0].mT.double() @ bas[x][2].double() for x in kb[pairs[pid]]}
        frames.append(tables.coupling_rows(pid, A_store, {t: _Top(v) for t, v in tops.items()},
                                           cfg, int(next(iter(jac.values())).shape[-1]),
                                           overlaps=overlaps))
    coupling = conform("coupling", pd.concat(frames, ignore_index=True))
    coupling.insert(0, "run_b", name_b)
    coupling.insert(0, "run_a", name_a)
    ang = (pd.concat(angles, ignore_index=True) if angles else
           pd.DataFrame(columns=list(ANGLE_COLUMNS)))
    ang.insert(0, "run_b", name_b)
    ang.insert(0, "run_a", name_a)
    return CrossCoupling(coupling=coupling, angles=ang[list(ANGLE_COLUMNS)])


@dataclass
class _Top:
    """``tables.coupling_rows`` reads the measured Jacobian's ``.top.S``, ``.top.fro2``,
    ``.top.trace`` and ``.top.trace2``."""

    top: svd.TopK


def sweep_runs(root: str | os.PathLike[str]) -> list[tuple[str, list[tuple[str, Path]]]]:
    """A sweep directory's finished units per label, in step order: [(label, [(name, dir)])]."""
    from blockcoupling.runs.read import open_sweep

    sw = open_sweep(root)
    done = sw.done().sort_values(["label", "step"], na_position="last", kind="stable")
    out = []
    for label, df in done.groupby("label", sort=False):
        out.append((str(label), [(f"{label}-step{int(r.step)}" if r.step == r.step and
                                  r.step is not None else str(r.unit_id), sw.run_dir(r.unit_id))
                                 for r in df.itertuples()]))
    return out


def cross_sweep(runs: Sequence[RunLike] | str | os.PathLike[str], *,
                labels: Sequence[str] | None = None, **options: Any) -> CrossCoupling:
    """Every run against the last one (checkpoints against the final model): the
    [`cross_coupling`][blockcoupling.studies.cross.cross_coupling] tables of each, stacked (``run_a`` names the checkpoint). ``runs``
    may be a sweep directory: per label, every finished checkpoint against its last."""
    if isinstance(runs, (str, os.PathLike)):
        parts = [cross_sweep([d for _, d in units], labels=[n for n, _ in units], **options)
                 for _, units in sweep_runs(runs) if len(units) >= 2]
        if not parts:
            raise BlockCouplingError(f"{runs}: no label of the sweep has two finished units")
        return CrossCoupling(pd.concat([p.coupling for p in parts], ignore_index=True),
                             pd.concat([p.angles for p in parts], ignore_index=True))
    if len(runs) < 2:
        raise BlockCouplingError("a cross-coupling sweep needs at least two runs")
    names = list(labels) if labels is not None else [str(r) for r in runs]
    last = _open(runs[-1])[0]
    parts = [cross_coupling(r, last, labels=(n, names[-1]), **options)
             for r, n in zip(runs[:-1], names[:-1], strict=True)]
    return CrossCoupling(pd.concat([p.coupling for p in parts], ignore_index=True),
                         pd.concat([p.angles for p in parts], ignore_index=True))


__all__ = ["CrossCoupling", "cross_coupling", "cross_sweep"]
