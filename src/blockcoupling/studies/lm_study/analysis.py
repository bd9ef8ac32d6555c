"""The lm-family study's tests (H1 across runs, H2 within runs; scipy.stats and
statsmodels) and the statement of what they found."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from blockcoupling.engine.statistic import seed_level
from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies import joins
from blockcoupling.studies.lm_study.design import StudySpec, end_point


def _one_sided(p_two: float, stat: float) -> float:
    """One-sided p for 'greater' from a two-sided p and the sign of the statistic."""
    return p_two / 2 if stat > 0 else 1 - p_two / 2


def hypothesis_tests(models: pd.DataFrame, emergence: pd.DataFrame, alpha: float) -> dict[str, Any]:
    import scipy.stats as st

    from blockcoupling.studies.regression import partial_correlation, regression

    controls = ["log_params", "log_d_model", "log_train_tokens"]
    out: dict[str, Any] = {"alpha": alpha, "predictors": {}}
    y = models["accuracy"].to_numpy(dtype=float)
    for x in ("coupling_vs_null_mean", "coupling_mean"):
        entry: dict[str, Any] = {"x": x, "y": "accuracy", "alternative": "slope > 0"}
        try:
            r = regression(models[x], y, n_boot=0)
            entry.update({k: r[k] for k in ("n", "slope", "intercept", "slope_stderr", "r",
                                            "r2", "p")})
            entry["p_one_sided"] = _one_sided(r["p"], r["slope"])
        except BlockCouplingError as err:
            entry["skipped"] = str(err)
        try:
            pc = partial_correlation(models[x], y, [models[c] for c in controls])
            entry["partial"] = {"controlling_for": controls, **pc,
                                "p_one_sided": _one_sided(pc["p"], pc["r"])}
        except BlockCouplingError as err:
            entry["partial"] = {"controlling_for": controls, "skipped": str(err)}
        out["predictors"][x] = entry
    first = emergence[emergence["step"] == 0].set_index("run_id")["coupling_vs_null_mean"]
    ends = set(zip(models["run_id"], models["step"], strict=True))  # each run's end point
    last = emergence[[key in ends for key in zip(emergence["run_id"], emergence["step"],
                                                  strict=True)]].set_index(
        "run_id")["coupling_vs_null_mean"]
    pair = pd.concat([first.rename("init"), last.rename("final")], axis=1).dropna()
    h2: dict[str, Any] = {"n": int(len(pair)), "alternative": "final > init"}
    if len(pair) >= 2:
        t = st.ttest_rel(pair["final"], pair["init"], alternative="greater")
        h2.update(mean_difference=float((pair["final"] - pair["init"]).mean()),
                  t=float(t.statistic), p_t=float(t.pvalue))
        try:
            w = st.wilcoxon(pair["final"], pair["init"], alternative="greater")
            h2.update(wilcoxon=float(w.statistic), p_wilcoxon=float(w.pvalue))
        except ValueError as err:
            h2["wilcoxon_skipped"] = str(err)
    out["H2_emergence"] = h2
    return out


def statement_lines(models: pd.DataFrame, tests: dict[str, Any], spec: StudySpec,
                    noise: dict[str, Any]) -> list[str]:
    """What the study found, in words: H1, raw c_K, H2, the noise floor, the stopping steps,
    and what the study cannot show."""
    a = spec.alpha
    lines = []
    h1 = tests["predictors"]["coupling_vs_null_mean"]
    if "skipped" in h1:
        lines.append(f"H1 could not be tested: {h1['skipped']}.")
    else:
        verdict = "supported" if h1["p_one_sided"] < a and h1["slope"] > 0 else "not supported"
        lines.append(
            f"H1 (coupling above chance rises with held-out accuracy across {h1['n']} "
            f"independent runs): {verdict} at alpha = {a:g}: slope {h1['slope']:.4g} accuracy "
            f"points per unit of coupling_vs_null, R^2 = {h1['r2']:.3f}, one-sided "
            f"p = {h1['p_one_sided']:.3g}.")
        pc = h1["partial"]
        lines.append("Given log10 parameters, log10 d_model and log10 training tokens: " + (
            f"partial r = {pc['r']:+.3f}, one-sided p = {pc['p_one_sided']:.3g} ({pc['df']} df)."
            if "r" in pc else f"not computable ({pc['skipped']})."))
    raw = tests["predictors"]["coupling_mean"]
    if "r2" in raw:
        lines.append(f"Raw c_K (one K for every run) against accuracy: slope "
                     f"{raw['slope']:.4g}, R^2 = {raw['r2']:.3f}, one-sided "
                     f"p = {raw['p_one_sided']:.3g}.")
    h2 = tests["H2_emergence"]
    if "p_t" in h2:
        verdict = "supported" if h2["p_t"] < a and h2["mean_difference"] > 0 else "not supported"
        lines.append(
            f"H2 (coupling above chance at the end exceeds its value at step 0, {h2['n']} runs): "
            f"{verdict}: mean difference {h2['mean_difference']:+.4f}, paired t one-sided "
            f"p = {h2['p_t']:.3g}" + (f", Wilcoxon one-sided p = {h2['p_wilcoxon']:.3g}."
                                      if "p_wilcoxon" in h2 else "."))
    lines += _noise_lines(noise)
    flat = [r for r in models.itertuples() if not r.plateau_reached]
    rule = (f"the held-out loss improving by less than {100 * spec.plateau_tol:g} % over the "
            f"last doubling of steps, checked at powers of two from step {spec.min_steps}")
    ends = ", ".join(f"{r.run_id} {r.stop_step}" + (f" (end point {r.step})"
                                                       if r.step != r.stop_step else "")
                     for r in models.itertuples())
    if flat:
        lines.append(f"{len(flat)} of {len(models)} runs had not reached the plateau criterion "
                     f"({rule}) by their cap: " + ", ".join(r.run_id for r in flat)
                     + f". Stopping steps: {ends}.")
    else:
        lines.append(f"Every run trained until its plateau ({rule}); stopping steps: {ends}.")
    return [*lines, "What this cannot show: anything about LLMs (these are character-level "
            "models of thousands to a few hundred thousand parameters trained for minutes), "
            "causation (width, depth and training length vary together), or small effects "
            f"({len(models)} runs give a test of low power)."]


def _noise_lines(noise: dict[str, Any]) -> list[str]:
    """The noise floor in words: the sd over seeds of one configuration, and its seed-level
    statistic beside the within-model standard error."""
    if not noise:
        return []
    lines = [f"Noise floor ({noise['config']}, {noise['n_seeds']} seeds): sd of the final "
             f"coupling_vs_null {noise['coupling_vs_null_sd']:.4f}, of the accuracy "
             f"{noise['accuracy_sd']:.2f} points."]
    sl = noise.get("seed_level")
    if sl:
        lines.append(
            f"Seed level ({noise['config']}, runs as the unit of replication): final "
            f"coupling_vs_null {sl['mean']:.4f}, se over seeds {sl['se']:.4f} (95 % t "
            f"interval {sl['ci_low']:.4f} to {sl['ci_high']:.4f}, {sl['n_runs'] - 1} df), "
            f"against a within-model se over prompts of {sl['within_se']:.4f}.")
    return lines


def emergence_table(stat: pd.DataFrame, scores: pd.DataFrame, spec: StudySpec, *,
                    where: str) -> pd.DataFrame:
    """One row per measured checkpoint (``run_id``, ``step``): coupling above chance and raw
    c_K with their standard errors and chance level (from the sweep's statistic ``stat``),
    the held-out accuracy and loss beside (``scores``), runs in the spec's order."""
    wide = stat.pivot_table(index=["label", "step"], columns="variant",
                            values=["mean", "se", "chance"], aggfunc="first")
    em = pd.DataFrame({
        "run_id": [str(i[0]) for i in wide.index], "step": [int(i[1]) for i in wide.index],
        "coupling_vs_null_mean": wide[("mean", "coupling_vs_null")].to_numpy(),
        "coupling_vs_null_se": wide[("se", "coupling_vs_null")].to_numpy(),
        "coupling_mean": wide[("mean", "coupling")].to_numpy(),
        "coupling_se": wide[("se", "coupling")].to_numpy(),
        "coupling_chance": wide[("chance", "coupling")].to_numpy()})
    em = joins.join_on(em, scores[["run_id", "step", "accuracy", "loss"]], ["run_id", "step"],
                       names=("the measured checkpoints", "the trained checkpoints' scores"),
                       what=f"{where} is inconsistent: run it again with a new --out")
    order = {r.run_id: i for i, r in enumerate(spec.runs)}
    return em.sort_values(["run_id", "step"], key=lambda c: c.map(order) if c.name == "run_id"
                          else c).reset_index(drop=True)


def models_table(spec: StudySpec, em: pd.DataFrame, scores: pd.DataFrame,
                 logs: dict[str, Any]) -> pd.DataFrame:
    """One row per run at its end point (`end_point`): its shape, data, parameters and
    training tokens, the coupling and held-out scores there, and where it stopped."""
    models = []
    for run in spec.runs:
        g = em[em["run_id"] == run.run_id]
        log = logs[run.run_id]
        end = end_point(dict(zip(g["step"], g["loss"], strict=True)), spec.plateau_tol)
        last = g[g["step"] == end].iloc[0]
        srow = scores[(scores["run_id"] == run.run_id) & (scores["step"] == end)].iloc[0]
        plat = log["plateau"]
        models.append({
            "run_id": run.run_id, "name": run.name, "seed": run.seed, "step": end,
            "n_layer": run.n_layer, "d_model": run.n_embd, "batch_size": run.batch_size,
            "data_chars": int(log["n_train_tokens"]),  # the training split it drew from
            "params": int(srow["n_params"]), "train_tokens": int(srow["train_tokens"]),
            **{c: float(last[c]) for c in ("coupling_vs_null_mean", "coupling_vs_null_se",
                                           "coupling_mean", "coupling_se", "coupling_chance",
                                           "accuracy", "loss")},
            "stop_step": int(log["end_step"]), "plateau_reached": plat["reached"],
            "plateau": plat})
    mt = pd.DataFrame(models)
    mt["log_params"] = np.log10(mt["params"])
    mt["log_d_model"] = np.log10(mt["d_model"])
    mt["log_train_tokens"] = np.log10(mt["train_tokens"])
    return mt


def noise_floor(mt: pd.DataFrame) -> dict[str, Any]:
    """The seeds of the first configuration trained more than once: the sd of their final
    coupling above chance and accuracy, and the runs as the unit of replication
    (``engine.statistic.seed_level``); {} where no configuration has several seeds."""
    multi = mt.groupby("name").filter(lambda g: len(g) > 1)
    if not len(multi):
        return {}
    name = multi["name"].iloc[0]
    g = mt[mt["name"] == name]
    return {"config": name, "n_seeds": int(len(g)),
            "coupling_vs_null_sd": float(g["coupling_vs_null_mean"].std(ddof=1)),
            "accuracy_sd": float(g["accuracy"].std(ddof=1)),
            "seed_level": seed_level(g, by=("name",), value="coupling_vs_null_mean",
                                     within_se="coupling_vs_null_se"
                                     ).iloc[0].drop("name").to_dict()}
