"""What ``study generalization`` found, in words, whatever it is (``study.json``'s
``statement``, the page's first section, the how-to's source): one function per section,
in the order a referee reads them (the design and its spread, the positive controls, the
within-cell test, each factor, the across-cell tests, exploratory, power, limits)."""

from __future__ import annotations

import math
from typing import Any

from blockcoupling.studies.generalization.design import (
    PLANNING,
    GeneralizationSpec,
    describe_design,
    design_power,
)

__all__ = ["statement"]


def _p(p: float) -> str:
    return f"{p:.2g}"


def _verdict(p: float, alpha: float) -> str:
    return "supported" if p < alpha else "not supported"


def _pow(powers: dict[str, Any], name: str) -> str:
    r = powers.get(name, {})
    return f"power {r['power']:.2f}" if "power" in r else "power not computed"


def _slope(e: dict[str, Any], unit: str) -> str:
    return (f"{e['slope']:+.4g} ± {e['slope_stderr']:.2g} {unit} (95 % CI {e['ci95'][0]:+.3g} "
            f"to {e['ci95'][1]:+.3g}, {e['alternative']} p = {_p(e['p'])}, {e['df']} df)")


def _spread(spec: GeneralizationSpec, a: dict[str, Any]) -> str:
    v, cells, sp = spec.variants[0], a["cells"], a["spread"]
    acc, cv = cells["test_accuracy_mean"], cells[f"{v}_mean"]
    return (f"Test accuracy across the cells: {acc.min():.3f} to {acc.max():.3f} (between-cell "
            f"sd {sp['accuracy_between_cell_sd']:.3f}, seed sd within a cell "
            f"{sp['accuracy_seed_sd']:.3f}); {v}: {cv.min():.4f} to {cv.max():.4f} "
            f"(between-cell sd {sp[f'{v}_between_cell_sd']:.4f}, seed sd "
            f"{sp[f'{v}_seed_sd']:.4f}; the within-model se over one run's images is "
            f"{sp[f'{v}_within_model_se']:.4f}, not a replication se).")


def _control(ctrl: dict[str, Any], where: str) -> str:
    """The positive control C ``where`` in words, per variant."""
    parts = [f"{name}: {c['cells_passing']} of {c['n_cells']} cells above chance (lowest "
             f"cell mean {c['min_cell_mean']:.4f}, largest one-sided p {c['max_p']:.2g});"
             f" over all runs {c['runs']['mean']:.4f} ± {c['runs']['se']:.4f} "
             "(seed-level se)" for name, c in ctrl["variants"].items()]
    return (f"Positive control C {where} ({'passed' if ctrl['passed'] else 'FAILED'}): "
            + "; ".join(parts) + ".")


def _controls(spec: GeneralizationSpec, a: dict[str, Any], powers: dict[str, Any]
              ) -> list[str]:
    """C (coupling above chance in every cell), the comparison point, and PC (the assay
    detects a known contrast at fixed data)."""
    where = "at the end of training" if a["point"] == "final" else f"at step {a['point']}"
    lines = [] if a["point"] == "final" else [_control(a["control_final"],
                                                       "at the end of training")]
    lines.append(_control(a["control"], where))
    if a["point"] != "final" or not a["control"]["passed"]:
        lines.append(f"Comparison point: {a['reason']}.")
    v, pc = spec.variants[0], a["tests"].get("PC")
    if pc and "difference" in pc.get(v, {}):
        c, acc = pc[v], pc["test_accuracy"]
        lines.append(
            f"PC, the positive control of the assay (drop-path {spec.train.drop_path:g} vs "
            f"{spec.control_drop_path:g} at {spec.control_cell()[0]} clean images, "
            f"{c['design']['n']} vs {c['control']['n']} seeds): {v} {c['design']['mean']:.4f} "
            f"vs {c['control']['mean']:.4f}, difference {c['difference']:+.4f} (Welch t = "
            f"{c['t']:.2f}, {c['df']:.1f} df, one-sided p = {_p(c['p'])}): "
            f"{'detected' if c['p'] < spec.alpha else 'NOT detected'} ({_pow(powers, 'PC')} "
            f"at the planned difference {PLANNING['control_difference']:g}); test accuracy "
            f"{acc['design']['mean']:.3f} vs {acc['control']['mean']:.3f} (difference "
            f"{acc['difference']:+.3f}, two-sided p = {_p(acc['p'])}).")
    return lines


def _within(spec: GeneralizationSpec, w: dict[str, Any], powers: dict[str, Any]) -> str:
    """W1 (the primary test) and EW."""
    if "within" not in w:
        return f"W1 not computable: {w['skipped']}."
    wi, fe, eq = w["within"], w["fixed_effects"], w["equivalence"]
    inside = "inside" if eq["equivalent"] else "not inside"
    return (f"W1, the primary test (within cells: seed to seed, {w['n_runs']} runs in "
            f"{w['n_cells']} cells, Mundlak split of the mixed model): within slope "
            f"{wi['slope']:+.4g} ± {wi['slope_stderr']:.2g} per unit of accuracy, one-sided "
            f"p = {_p(wi['p_greater'])}: {_verdict(wi['p_greater'], spec.alpha)} "
            f"({_pow(powers, 'W1')} at a within slope of {PLANNING['across_slope']:g}, the "
            f"across-cell slope of the first run); pooled within-cell r = "
            f"{fe['within_r']:+.3f}; between-cell slope {w['between']['slope']:+.4g} ± "
            f"{w['between']['slope_stderr']:.2g}. EW (equivalence within ±{eq['bound']:g}): "
            f"the {100 * eq['ci_tost_level']:.0f} % interval of the within slope, "
            f"[{eq['ci_tost'][0]:+.4f}, {eq['ci_tost'][1]:+.4f}], is {inside} the bounds "
            f"(p = {_p(eq['p_tost'])}; {_pow(powers, 'EW_at_0')} at a slope of 0).")


def _factors(spec: GeneralizationSpec, f: dict[str, Any], powers: dict[str, Any]
             ) -> list[str]:
    """S1 (the key contrast), S2, N1; the size slopes per noise level; accuracy beyond the
    factors."""
    v = spec.variants[0]
    lines = []
    for name, what, unit in (("S1", "training-set size with clean labels (the key contrast; "
                              "over the clean cells' means)", "per ln(images)"),
                             ("S2", "training-set size over all cells (noise levels held "
                              "fixed)", "per ln(images)"),
                             ("N1", "label noise (size levels held fixed)",
                              "per unit of noise")):
        e = f.get(name, {})
        if "slope" not in e.get("coupling", {}):
            lines.append(f"{name} ({what}): not computable ({e.get('skipped', 'skipped')}).")
            continue
        c, acc = e["coupling"], e["accuracy"]
        lines.append(
            f"{name}, {what}: accuracy {_slope(acc, unit)}; {v} {_slope(c, unit)}: "
            f"{_verdict(c['p'], spec.alpha)} ({_pow(powers, name)} to detect "
            f"{powers.get(name, {}).get('effect', 'the planned slope')}).")
    parts = [f"noise {100 * float(e):g} %: {v} {g['coupling']['slope']:+.4g} ± "
             f"{g['coupling']['slope_stderr']:.2g}, accuracy {g['accuracy']['slope']:+.3g}"
             for e, g in f.get("size_by_noise", {}).items() if "slope" in g.get("coupling", {})]
    if parts:
        lines.append("Size slopes per ln(images) at each noise level (exploratory): "
                     + "; ".join(parts) + ".")
    beyond = f.get("accuracy_beyond_factors")
    if beyond:
        lines.append(f"Accuracy beyond both factors (exploratory: cell means on accuracy with "
                     f"both factors' levels as fixed effects): slope {beyond['slope']:+.4g} ± "
                     f"{beyond['slope_stderr']:.2g} (two-sided p = {_p(beyond['p'])}, "
                     f"{beyond['df']} df).")
    return lines


def _across(spec: GeneralizationSpec, tests: dict[str, Any]) -> list[str]:
    """H1, E1 and H1b over the cells and runs."""
    from blockcoupling.studies.regression import tost_power

    v, h, m = spec.variants[0], tests["H1_E1"], tests["H1b"]
    if "r" not in h:
        lines = [f"H1 and E1 not computable: {h['skipped']}."]
    else:
        inside = "inside" if h["equivalent"] else "not inside"
        lines = [
            f"H1 (across the {h['n']} cells, {v} rises with test accuracy, one-sided): "
            f"{_verdict(h['p_greater'], spec.alpha)}: r = {h['r']:+.3f}, one-sided p = "
            f"{h['p_greater']:.3g}; slope {h['slope']:.4g} ± {h['slope_stderr']:.2g} per "
            f"unit of accuracy (power {design_power(spec):.2f} at r = {spec.bound:g}, exact).",
            f"E1 (equivalence within ±{h['bound']:g}, TOST): the "
            f"{100 * h['ci_tost_level']:.0f} % interval of r, [{h['ci_tost'][0]:+.3f}, "
            f"{h['ci_tost'][1]:+.3f}], is {inside} the bounds (p = {h['p_tost']:.3g}; power "
            f"{tost_power(spec.n_cells, spec.bound, spec.alpha):.2f} at r = 0)."]
    if "slope" in m:
        lines.append(
            f"H1b (over the {m['n_runs']} runs, random intercept per cell; it mixes the "
            f"between- and within-cell slopes): slope {m['slope']:.4g} ± "
            f"{m['slope_stderr']:.2g}, one-sided p = {m['p_greater']:.3g}"
            f" ({_verdict(m['p_greater'], spec.alpha)}"
            + ("" if m["converged"] else "; the fit did not converge") + ").")
    tr = tests.get("exploratory", {}).get("train_accuracy", {})
    if "r" in tr:
        lines.append(f"Exploratory: across the cells {v} correlates with the training "
                     f"accuracy on the (noisy) training labels r = {tr['r']:+.3f}, with the "
                     f"test accuracy r = {h.get('r', math.nan):+.3f}.")
    lines += [f"The same over the cells with {name}: r = {o['r']:+.3f}, one-sided p = "
              f"{o['p_greater']:.3g}." for name, o in tests["other_variants"].items()
              if "r" in o]
    return lines


def _limits(spec: GeneralizationSpec, powers: dict[str, Any]) -> list[str]:
    reps = next((r["reps"] for r in powers.values() if "reps" in r), 0)
    return [
        "Power: H1 and E1 exact (bivariate-normal cell means); every other test by "
        f"simulation ({reps} data sets each) from planning values fixed before this run "
        "(design.PLANNING, from the first run of 2026-11-27).",
        "What this cannot show: anything about LLMs or the paper's models (a tiny ViT on "
        f"{spec.train.dataset} for {spec.train.steps} steps); a cause (the factors are "
        "manipulated, coupling and accuracy are both outcomes: a relation between them "
        "here is a correlation; the intervention study manipulates coupling itself); "
        f"correlations below {spec.bound:g} across cells and within slopes below the "
        "planned one (the power is stated for those); other architectures, widths or K "
        "(held fixed by design). Confounds named: every cell of a seed starts from the same "
        "initialisation; label noise changes what the training accuracy measures (fit to "
        "wrong labels)."]


def statement(spec: GeneralizationSpec, a: dict[str, Any], powers: dict[str, Any]
              ) -> list[str]:
    """The study's result in words, whatever it is."""
    return [f"Design: {describe_design(spec)[0]}.", _spread(spec, a),
            *_controls(spec, a, powers), _within(spec, a["tests"]["W1_EW"], powers),
            *_factors(spec, a["tests"]["factors"], powers), *_across(spec, a["tests"]),
            *_limits(spec, powers)]
