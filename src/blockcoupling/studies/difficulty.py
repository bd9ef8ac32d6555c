"""Per-prompt coupling against prompt difficulty and length (the paper's fig. 10, Easy2Hard-Bench):
``blockcoupling difficulty RUN [--ratings hf:e2h-arc[@FILE]]``.

Each prompt's coupling by the headline rule (``Measurement.per_prompt_coupling``), its
difficulty rating (``prompts.benchmarks.load_ratings``, joined by the prompt's text:
``studies.joins.attach_to_prompts``) and its length in tokens; then, for the rating and for the
length, ``studies.regression.regression``. The prompt is the unit (n = prompts with a
rating); a prompt without a rating, a text rated twice, or values read at other positions in
different prompts is one error. Rows in prompt-id order (docs/conventions.md, "Difficulty").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.engine.statistic import HEADLINE_VARIANTS
from blockcoupling.errors import BlockCouplingError
from blockcoupling.jsonsafe import jsonable
from blockcoupling.store.fileio import write_json
from blockcoupling.studies import joins
from blockcoupling.studies.regression import fit_text

#: the predictors of the per-prompt coupling, as the table names them
PREDICTORS = ("rating", "n_tokens")


@dataclass
class DifficultyResult:
    """The joined table (one row per prompt) and the regressions of the coupling on each
    predictor, per variant (``fits[variant][predictor]``)."""

    table: pd.DataFrame
    fits: dict[str, dict[str, Any]]
    k: int
    ratings: str

    def to_dict(self) -> dict[str, Any]:
        return jsonable({"k": self.k, "ratings": self.ratings, "n_prompts": len(self.table),
                         "rule": "per prompt: mean over layer pairs l != l' at its last "
                                 "measured token (p = 1, ujv); regressions over prompts",
                         "fits": self.fits, "prompts": self.table.to_dict("records")})

    def to_json(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    def summary(self) -> str:
        lines = [f"{len(self.table)} prompts, K={self.k}, ratings {self.ratings}"]
        for variant, fits in self.fits.items():
            lines += [f"  {variant} ~ {name}: " + fit_text(
                r, "n={n} slope={slope:.4g} R^2={r2:.3f} p={p:.3g} rho={spearman_rho:+.3f}")
                for name, r in fits.items()]
        return "\n".join(lines)


#: the variants fig. 10 is drawn for, the leading variant first (those the run measured)
DIFFICULTY_VARIANTS: tuple[str, ...] = HEADLINE_VARIANTS


def difficulty_table(m: Any, ratings: pd.DataFrame, *, k: int | None = None,
                     variants: Sequence[str] = DIFFICULTY_VARIANTS,
                     source: str = "the ratings") -> pd.DataFrame:
    """One row per measured prompt, in prompt-id order: ``prompt_id``, ``n_tokens``, the
    per-prompt value of each variant measured (columns named by the variant) and ``rating``
    (the row of the prompt's text in ``ratings``: ``text``, ``rating``)."""
    k = int(k) if k is not None else int(min(m.config.k))
    prompts = joins.canonical_order(m.prompts.itertuples(index=False),
                                    key=lambda r: str(r.prompt_id))
    out = pd.DataFrame(prompts, columns=m.prompts.columns)[["prompt_id", "text", "n_tokens"]]
    out["prompt_id"] = out["prompt_id"].astype(str)
    present = set(m.coupling.loc[m.coupling["kind"] == "depth", "variant"])
    got = [v for v in variants if v in present]
    if not got:
        raise BlockCouplingError(f"the run has no depth-wise {' or '.join(variants)} rows; "
                                 "measure with --coupling depth")
    tokens = joins.measured_tokens(m.coupling, m.prompts, m.headline_tokens, where="the run")
    if not tokens.roles:
        raise BlockCouplingError(
            f"the run's per-prompt values sit at {tokens.describe()}, not at one position of "
            "every prompt, so they are not one quantity; measure it at one token (--tokens)")
    for v in got:
        pp = m.per_prompt_coupling(k, variant=v)
        out[v] = pd.Series(pp["value"].to_numpy(), index=pp["prompt_id"].astype(str)
                           ).reindex(out["prompt_id"]).to_numpy()
    out["rating"] = joins.attach_to_prompts(
        out, ratings, "rating", source=source,
        fix="measure the rated set itself (--prompts hf:e2h-arc ...) and give the same set "
            "to --ratings")
    return out.drop(columns="text")


def difficulty_study(run: str | Path | Any, ratings: str | None = None, *,
                     k: int | None = None,
                     variants: Sequence[str] = DIFFICULTY_VARIANTS,
                     n_boot: int = 2000, seed: int = 0) -> DifficultyResult:
    """The join and its regressions for one run (a run directory or a Measurement);
    ``ratings`` defaults to the run's own prompt set (its meta ``prompts_spec``)."""
    from blockcoupling.prompts.benchmarks import load_ratings
    from blockcoupling.studies.regression import regression

    if isinstance(run, (str, Path)):
        from blockcoupling.store.reader import open_run

        run = open_run(Path(run))
    spec = ratings or run.meta.get("prompts_spec")
    if not spec or not str(spec).startswith("hf:"):
        raise BlockCouplingError(
            "give the ratings with --ratings hf:e2h-arc (or hf:e2h-gsm8k, hf:e2h-winogrande, "
            "each also as @/path/to/rows.jsonl): the run's prompts "
            f"({spec or 'not recorded'}) carry no difficulty ratings")
    table = difficulty_table(run, load_ratings(str(spec)), k=k, variants=variants,
                             source=str(spec))
    kk = int(k) if k is not None else int(min(run.config.k))
    fits: dict[str, dict[str, Any]] = {}
    for v in [c for c in variants if c in table.columns]:
        fits[v] = {}
        for name in PREDICTORS:
            try:
                fits[v][name] = regression(table[name], table[v], n_boot=n_boot, seed=seed)
            except BlockCouplingError as err:
                fits[v][name] = {"skipped": str(err)}
    return DifficultyResult(table, fits, kk, str(spec))


__all__ = ["DIFFICULTY_VARIANTS", "PREDICTORS", "DifficultyResult", "difficulty_study",
           "difficulty_table"]
