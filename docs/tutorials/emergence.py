"""Tutorial 2: does coupling emerge over a training run? The monitor and a sweep.

Trains a tiny character-level GPT-2 (4 blocks, d = 64) on Python's own help texts for 150
steps with a ``CouplingMonitor`` in the loop, saves checkpoints in the Hugging Face Trainer
layout (``checkpoint-N``), measures them afterwards with a sweep (in this process; the same spec
runs on Ray), and plots chance-corrected coupling with its standard error against the step,
next to the held-out loss. Run: ``python docs/tutorials/emergence.py [OUT]`` (about a minute
of CPU time). The page docs/tutorials/emergence.md shows the code between the markers.
"""

from __future__ import annotations

import shutil

from common import out_dir, save_figure, write_table

OUT = out_dir()

# --8<-- [start:setup]
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

import blockcoupling as bc
from blockcoupling.studies import CouplingMonitor, run_sweep
from blockcoupling.studies.demo import build_tokenizer, corpus_documents

torch.manual_seed(0)
docs = corpus_documents()                        # pydoc topics, cleaned to ASCII
train_text = "\n\n".join(docs[i] for i in range(len(docs)) if i % 10)
val_text = "\n\n".join(docs[i] for i in range(len(docs)) if i % 10 == 0)
tokenizer = build_tokenizer(train_text + val_text)  # one token per character
encode = lambda text: torch.tensor(tokenizer(text)["input_ids"])  # noqa: E731
train_ids, val_ids = encode(train_text), encode(val_text)

T = 32                                           # context length
config = GPT2Config(vocab_size=len(tokenizer), n_positions=T, n_embd=64, n_layer=4, n_head=4,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                    eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
model = GPT2LMHeadModel(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
work = Path("tutorial-emergence")                # the checkpoints and measurements go here


def batch(ids: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - T - 1, (n,), generator=generator)
    return torch.stack([ids[s:s + T + 1] for s in starts])          # (n, T + 1)


def loss_of(chunk: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=chunk[:, :-1]).logits                   # (n, T, vocab)
    return F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten())
# --8<-- [end:setup]

# --8<-- [start:train]
# held-out prompts the model never trains on: 8 windows of 24 characters
g_val = torch.Generator().manual_seed(1)
prompts = [tokenizer.decode(batch(val_ids, 1, g_val)[0, :24]) for _ in range(8)]
val_batch = batch(val_ids, 32, g_val)

STEPS = 150
CHECKPOINTS = [0, 5, 15, 40, 80, 150]           # log-spaced-ish: coupling moves early
monitor = CouplingMonitor(tokenizer, prompts[:4], every=None, steps=CHECKPOINTS,
                             out=work / "train" / "monitor", coupling=("depth",), k=(6,),
                             tokens="last")
log = {}
g_train = torch.Generator().manual_seed(0)
for step in range(STEPS + 1):
    if step > 0:                                 # step 0 is the initialisation
        model.train()
        loss = loss_of(batch(train_ids, 16, g_train))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    monitor.step(model, step)                    # measures at the CHECKPOINTS steps only
    if step in CHECKPOINTS:
        model.eval()
        with torch.no_grad():
            log[step] = float(loss_of(val_batch))
        folder = work / "train" / f"checkpoint-{step}"  # the HF Trainer layout
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
monitor.close()
# --8<-- [end:train]

# --8<-- [start:monitor]
# one row per measured step and variant: mean, se, chance, ...
during = bc.coupling_statistic(work / "train" / "monitor", variant="coupling_vs_null")
print(during[["step", "mean", "se", "n_prompts"]])
# --8<-- [end:monitor]

# --8<-- [start:sweep]
spec = {
    "name": "tutorial-emergence",
    "models": [{"label": "tiny GPT-2", "checkpoints": str(work / "train" / "checkpoint-*")}],
    "prompts": [{"name": "held-out", "texts": prompts}],
    "measure": {"coupling": ["depth"], "k": [6], "tokens": "last",
                "variants": ["coupling", "coupling_vs_null"]},
}
sweep = run_sweep(spec, work / "sweep", executor="local", progress=False)
# executor="ray" (the default) runs one unit per checkpoint on a Ray cluster instead
# --8<-- [end:sweep]

# --8<-- [start:curve]
import pandas as pd

stat = bc.coupling_statistic(sweep)             # one row per unit (checkpoint) and variant
raw = stat[stat["variant"] == "coupling"].set_index("step").sort_index()
null = stat[stat["variant"] == "coupling_vs_null"].set_index("step").sort_index()
curve = pd.DataFrame({
    "held-out loss": [round(log[int(s)], 3) for s in raw.index],
    "coupling c_K": [f"{a:.3f} ± {b:.3f}" for a, b in zip(raw["mean"], raw["se"])],
    "chance c_null": raw["chance"].round(3),
    "coupling_vs_null": [f"{a:.3f} ± {b:.3f}" for a, b in zip(null["mean"], null["se"])],
    "n prompts": raw["n_prompts"],
}).reset_index()
print(curve.to_string(index=False))
# --8<-- [end:curve]
write_table(curve, OUT / "curve.md")

# --8<-- [start:figure]
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.8))
x = null.index.to_series().clip(lower=1)        # log axis: step 0 drawn at 1
ax.errorbar(x, null["mean"], yerr=1.96 * null["se"], fmt="o-", capsize=3,
            label="sweep: 8 held-out prompts, ± 1.96 se")
ax.plot(during["step"].clip(lower=1), during["mean"], "s--", alpha=0.7,
        label="monitor during training: 4 prompts")
ax.axhline(0, color="grey", lw=0.8, ls=":")
ax.set_xscale("log")
ax.set_xlabel("training step (0 drawn at 1)")
ax.set_ylabel("coupling_vs_null, K = 6")
ax2 = ax.twinx()
ax2.plot(x, curve["held-out loss"], color="tab:red", alpha=0.6)
ax2.set_ylabel("held-out loss (nats / char)", color="tab:red")
ax.legend(loc="upper left", fontsize=8)
# --8<-- [end:figure]
save_figure(fig, OUT / "emergence.png")
stat.to_csv(OUT / "statistic.csv", index=False)
shutil.rmtree(work)                              # checkpoints are not part of the site
