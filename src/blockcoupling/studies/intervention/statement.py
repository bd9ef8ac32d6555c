"""What ``study intervention`` found, in words, whatever it is (``study.json``'s
``statement``, the page's first section, the README's source)."""

from __future__ import annotations

from typing import Any

from blockcoupling.studies.intervention.design import (
    PLANNING,
    InterventionSpec,
    describe_design,
)

__all__ = ["statement"]


def _p(p: float) -> str:
    return f"{p:.2g}"


def _arm(arms: Any, strength: float, col: str, digits: int = 3) -> str:
    row = arms[arms["strength"] == strength].iloc[0]
    return f"{row[f'{col}_mean']:.{digits}f} ± {row[f'{col}_se']:.{digits}f}"


def _power(powers: dict[str, Any], name: str) -> str:
    return f"power {powers[name]['power']:.2f}" if "power" in powers.get(name, {}) else ""


def _accuracy(name: str, eq: str, what: str, d: dict[str, Any], spec: InterventionSpec,
              powers: dict[str, Any]) -> str:
    if "difference" not in d:
        return f"{name} not computable: {d.get('skipped')}."
    verdict = "supported" if d["p"] < spec.alpha else "not supported"
    inside = d["p_tost"] < spec.alpha
    return (f"{name} ({what}): test accuracy at strength {d['high']:+g} minus at 0, paired by "
            f"seed ({d['n_seeds']} seeds): {d['difference']:+.4f} (95 % CI "
            f"{d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f}; one-sided p = {_p(d['p'])}): "
            f"{verdict} ({_power(powers, name)} at {'+' if name == 'H2' else '-'}"
            f"{spec.bound:g}). {eq} (equivalence within ±{spec.bound:g}, TOST p = "
            f"{_p(d['p_tost'])}): {'equivalent' if inside else 'not shown equivalent'} "
            f"({_power(powers, eq + '_at_0')} at a difference of 0).")


def statement(spec: InterventionSpec, a: dict[str, Any], powers: dict[str, Any]) -> list[str]:
    """The study's result in words."""
    v = spec.variant
    arms, tests = a["arms"], a["tests"]
    lines = [f"Design: {describe_design(spec)[0]}."]
    lines.append("Per arm (mean ± seed-level se over the seeds): " + "; ".join(
        f"strength {s:+g}: {v} {_arm(arms, s, v, 4)}, test accuracy "
        f"{_arm(arms, s, 'test_accuracy')}" for s in a["strengths"]) + ".")
    h = tests["H1"]
    steps = "; ".join(f"{p['low']:+g} to {p['high']:+g}: {p['difference']:+.4f} (p = "
                      f"{_p(p['p'])})" for p in h["pairs"] if "difference" in p)
    lines.append(
        f"H1, the manipulation check ({v} rises with strength at every adjacent pair, paired "
        f"one-sided t-tests): {'passed: monotone' if h['monotone'] else 'NOT monotone'} "
        f"({steps}); Spearman rho over the {h['spearman']['n']} runs "
        f"{h['spearman']['rho']:+.3f} (one-sided p = {_p(h['spearman']['p_greater'])}); "
        f"{_power(powers, 'H1_all')} for steps of {PLANNING['coupling_step']:g}.")
    lines.append(_accuracy("H2", "E2", "raising coupling raises accuracy", tests["H2_E2"], spec,
                           powers))
    lines.append(_accuracy("H3", "E3", "lowering coupling lowers accuracy", tests["H3_E3"], spec,
                           powers))
    side = []
    for c, label in (("train_ce", "training cross-entropy"), ("weight_norm", "weight norm"),
                     ("lss", "LSS at the token"), ("expodistance", "expodistance"),
                     ("equidistance_cv", "equidistance CV"), ("train_accuracy",
                                                               "training accuracy")):
        if c in tests["other_metrics"] and f"{c}_mean" in arms:
            side.append(f"{label} " + ", ".join(
                f"{s:+g}: {arms.loc[arms['strength'] == s, f'{c}_mean'].iloc[0]:.4g}"
                for s in a["strengths"]))
    if side:
        lines.append("What else the term changes (arm means): " + "; ".join(side) + ".")
    ex = tests["exploratory"]
    if "accuracy_on_coupling" in ex:
        e = ex["accuracy_on_coupling"]
        lines.append(f"Exploratory: within seeds, test accuracy per unit of {v} reached "
                     f"{e['slope']:+.4g} ± {e['slope_stderr']:.2g} (two-sided p = "
                     f"{_p(e['p'])}, {e['df']} df, all arms).")
    if "surrogate_vs_engine" in ex:
        s = ex["surrogate_vs_engine"]
        lines.append(f"The term's quantity against the engine: across the {s['n']} runs the "
                     f"exact traceless alignment of the final images and their {v} correlate "
                     f"Pearson r = {s['pearson']:+.3f}, Spearman {s['spearman']:+.3f}.")
    lines.append(
        "What this cannot show: other architectures, widths, data sets or training lengths "
        f"(one tiny ViT on {spec.train.dataset}, {spec.train.steps} steps); anything about "
        "LLMs; that coupling alone is what moved (the term also changes the training "
        "objective, the weights and the trajectories, listed above); effects on accuracy "
        f"smaller than {spec.bound:g} (the power is stated for that difference).")
    return lines
