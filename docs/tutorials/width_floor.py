"""Tutorial 3: coupling against benchmark scores, with the width floor diagnosed.

The paper correlates raw depth-wise coupling c_K at K = round(d/10) with Open LLM Leaderboard
scores. (1) From the paper's own Table 1 (shipped: ``blockcoupling.studies.paper_scores()``, ``--scores paper``)
and no model at all: how much of the scores the chance level of c_K, which depends on the
width d only, already explains. (2) Measured on random-init GPT-2 models of four widths: raw
c_K at K = d/10 rises with d along that floor, while the chance-corrected
``coupling_vs_null`` stays at 0. Run: ``python docs/tutorials/width_floor.py [OUT]`` (about
half a minute of CPU time).
"""

from __future__ import annotations

import json

from common import out_dir, save_figure, write_table

OUT = out_dir()

# --8<-- [start:floor]
import numpy as np

import blockcoupling as bc
from blockcoupling.studies import paper_scores
from blockcoupling.studies.regression import regression


def flat_floor(d: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Chance level c_null of c_K (p = 1) for a flat spectrum: 1 - sqrt(1/d + 1/K)."""
    return 1 - np.sqrt(1 / d + 1 / k)


table = paper_scores()                        # the paper's Table 1, 42 rows
table = table[table["score"].notna()].copy()
d = table["d_model"].astype(float).to_numpy()
table["K"] = np.maximum(1, np.round(d / 10))
table["floor"] = flat_floor(d, table["K"].to_numpy())
fits = {group: regression(rows["floor"], rows["score"].astype(float), n_boot=1000)
        for group, rows in table.groupby("group")}
for group, fit in fits.items():
    print(f"{group}: n = {fit['n']}, R^2 = {fit['r2']:.2f}, p = {fit['p']:.2g}, "
          f"Spearman rho = {fit['spearman_rho']:.2f}")
# --8<-- [end:floor]

import pandas as pd  # noqa: E402  (after the cell above, as on the page)

write_table(pd.DataFrame([
    {"models": g, "n": f["n"], "slope (score per unit of floor)": round(f["slope"], 1),
     "R^2": round(f["r2"], 2), "95% CI of R^2": f"[{f['r2_ci'][0]:.2f}, {f['r2_ci'][1]:.2f}]",
     "p": f"{f['p']:.2g}", "Spearman rho": round(f["spearman_rho"], 2)}
    for g, f in fits.items()]), OUT / "floor_fit.md")

# --8<-- [start:measure]
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2Model

from blockcoupling.studies.demo import minilm_dir

tokenizer = AutoTokenizer.from_pretrained(minilm_dir())  # any tokenizer will do: random weights
prompts = ["What is the capital of France? The capital is", "The cat sat on the mat.",
           "Two plus three equals five.", "Paris is in France.",
           "The river flows to the sea.", "Snow fell over the mountains."]
rows = []
for width in (64, 128, 256, 512):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=width, n_layer=4,
                        n_head=4, n_positions=64, bos_token_id=None, eos_token_id=None)
    model = GPT2Model(config).eval()                     # random init: nothing learned
    k = round(width / 10)                                # the paper's K = d/10
    m = bc.measure(model, tokenizer, prompts, coupling=("depth",), k=(k,), tokens="last",
                   variants=("coupling", "coupling_vs_null"), progress=False)
    stat = bc.coupling_statistic(m, k=k)                 # coupling_vs_null and raw c_K
    rows.append(stat.assign(d=width, floor=float(flat_floor(width, k))))

import pandas as pd

stat = pd.concat(rows)
raw = stat[stat["variant"] == "coupling"].set_index("d")
null = stat[stat["variant"] == "coupling_vs_null"].set_index("d")
widths = pd.DataFrame({
    "K = d/10": raw["k"], "flat-spectrum floor": raw["floor"].round(3),
    "measured chance c_null": raw["chance"].round(3),
    "raw c_K": [f"{a:.3f} ± {b:.3f}" for a, b in zip(raw["mean"], raw["se"])],
    "coupling_vs_null": [f"{a:.4f} ± {b:.4f}" for a, b in zip(null["mean"], null["se"])],
}).reset_index().rename(columns={"d": "d_model"})
print(widths.to_string(index=False))
# --8<-- [end:measure]

write_table(widths, OUT / "random_widths.md")

# --8<-- [start:figure]
import matplotlib.pyplot as plt

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for group, rows_g in table.groupby("group"):
    ax1.scatter(rows_g["floor"], rows_g["score"].astype(float), label=group, s=18)
ax1.set_xlabel("flat-spectrum chance level of c_K, K = d/10 (width only)")
ax1.set_ylabel("Open LLM Leaderboard score (paper, Table 1)")
ax1.set_title("no model measured: the width floor against the scores")
ax1.legend(fontsize=8)
grid = np.geomspace(48, 10000, 200)
ax2.plot(grid, flat_floor(grid, np.round(grid / 10)), color="grey", label="floor, K = d/10")
ax2.errorbar(raw.index, raw["mean"], yerr=1.96 * raw["se"], fmt="o",
             label="raw c_K, random init")
ax2.errorbar(null.index, null["mean"], yerr=1.96 * null["se"], fmt="s",
             label="coupling_vs_null")
ax2.axvline(768, ls=":", color="grey")
ax2.axvline(8192, ls=":", color="grey")
ax2.set_xscale("log")
ax2.set_xlabel("d_model")
ax2.set_title("random-init GPT-2: raw c_K follows the floor")
ax2.legend(fontsize=8)
# --8<-- [end:figure]
save_figure(fig, OUT / "width_floor.png")

# the concept page's figure: the floor against d for K = d/10 and for a fixed K = 10
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(grid, flat_floor(grid, np.round(grid / 10)), label="K = round(d/10)")
ax.plot(grid, flat_floor(grid, np.full_like(grid, 10)), label="K = 10")
for width in (768, 8192):
    ax.annotate(f"d = {width}: {flat_floor(width, round(width / 10)):.2f}",
                (width, flat_floor(width, round(width / 10))), textcoords="offset points",
                xytext=(-70, 8), fontsize=8)
ax.set_xscale("log")
ax.set_xlabel("d_model")
ax.set_ylabel("chance level c_null (flat spectrum)")
ax.legend(fontsize=8)
save_figure(fig, OUT / "floor_curve.png")
(OUT / "fits.json").write_text(json.dumps(fits, indent=1, default=float))
stat.to_csv(OUT / "random_widths_statistic.csv", index=False)
