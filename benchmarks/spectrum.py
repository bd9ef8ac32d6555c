"""Benchmark models whose block Jacobians have the singular-value decay of trained models.

Random-weight models, the benchmarks' usual subjects, have flat Jacobian spectra: the top-K's
subspace iteration (``engine/svd._iterated_subspace``) gives up on them by design. Trained
models' spectra decay (BENCHMARKS.md, "Issue 43 items 1-2"). This module measures that decay
and gives random models weights that reproduce it.

- `jacobians`: the dense float32 J^l_tt of every block at chosen tokens of one input (the
  engine's decode-step fast path where the model has one, else its generic reverse-mode route).
- `decay_summary`: what the top-K routes depend on, from the singular values of one J:
  ``s_i / s_1`` at fractions i/d of the dimension, ``s_{p+1} / s_K`` at K = 10 / 50 / 77 with
  the iteration's block width ``p = K + 48`` (where p + 1 <= d / 2) (its rate of convergence per Gram product is the
  square of that ratio), the effective rank (``exp`` of the entropy of ``s / sum s``) and the
  stable rank (``||J||_F^2 / s_1^2``), both over d.
- `TRAINED_PROFILE`: the median ``log(s_i / s_1)`` of the trained models' J^l_tt against
  ``x = i / d`` (measured by ``bench_spectra.py``; the numbers are its output, rounded).
- `realistic_`: THE construction. Every 2-D weight matrix W (m x n) inside the blocks is
  replaced, in place, by ``U diag(s) V^T`` with U (m x r), V (n x r) the Q factors of seeded
  Gaussian matrices (Haar-random orthonormal columns), r = min(m, n),
  ``s_i = exp(profile(i / r))`` (`profile`: `WEIGHT_PROFILE` interpolated linearly in x),
  scaled so that ``||W||_F`` is the initialisation's times ``sqrt(REF_WIDTH / d)`` (each
  matrix, so each layer, keeps its relative scale; d the model's width). The factor keeps
  the pre-activations of a unit-RMS input at the scale they have at the calibration width
  (768): the transformers initialisations keep std 0.02 at every width, so their
  pre-activations grow as sqrt(d), and that alone steepens the head of the J's spectrum
  (BENCHMARKS.md: the Llama-3-8B-shaped model at its initialisation). `WEIGHT_PROFILE` is not `TRAINED_PROFILE` itself: a block's J is a product of
  weight matrices (the MLP's two, through the activation and the norm), whose bulk decays
  by itself; it was calibrated so that the J^l_tt of the GPT-2-small-shaped model match
  `TRAINED_PROFILE` (BENCHMARKS.md gives the match at every shape). The profile is a
  function of i / d: the same relative decay at every width (an assumption: the trained
  models measured here are 64-384 wide).
- `build`: the benchmark models by name and spectrum (``--spectrum trained|flat``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from blockcoupling.engine import fastpath
from blockcoupling.engine.blocks import find_blocks, get_blocks
from blockcoupling.engine.capture import capture, residual_branch
from blockcoupling.engine.jacobian import jacobian_blocks

SPECTRA: tuple[str, ...] = ("flat", "trained")
#: the top-K widths whose gap `decay_summary` reports, and the iteration's extra columns
KS: tuple[int, ...] = (10, 50, 77)
ITER_EXTRA: int = 48  # engine/svd: _GRAM_WINDOW + _ITER_OVERSAMPLE
FRACTIONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 0.75)

#: (x = i / d, median log(s_i / s_1)) of the trained models' J^l_tt (`bench_spectra.py`);
#: x = 0 is s_1 itself. Filled in from the measurement (BENCHMARKS.md).
TRAINED_PROFILE: tuple[tuple[float, float], ...] = (
    (0.0, 0.0), (0.002, -0.0791), (0.005, -0.1979), (0.01, -0.3669), (0.02, -0.4995),
    (0.03, -0.5617), (0.05, -0.6694), (0.075, -0.8026), (0.1, -0.9113), (0.15, -1.0538),
    (0.2, -1.1615), (0.3, -1.3693), (0.4, -1.5626), (0.5, -1.7665), (0.6, -2.0173),
    (0.7, -2.3192), (0.8, -2.7245), (0.9, -3.5021),
    (1.0, -4.2797),  # extrapolated from 0.8-0.9: the measured tail holds the norms' null space
)
#: (x = i / r, log(s_i / s_1)) of the weight matrices (`realistic_`): the fixed point of
#: ``w <- w + (TRAINED_PROFILE - profile of the model's J)`` on the GPT-2-small-shaped
#: model, from ``w = TRAINED_PROFILE``, 3 steps (``bench_spectra.py --calibrate 4``; its
#: J then lie within 0.047 of TRAINED_PROFILE in log, RMS over the grid x = 0.002-0.9).
#: The J of random weights decay by themselves (their bulk is a product of random
#: matrices): the weights need the trained head, not the trained bulk.
REF_WIDTH: int = 768
WEIGHT_PROFILE: tuple[tuple[float, float], ...] = (
    (0.0, 0.0), (0.002, -0.104), (0.005, -0.3057), (0.01, -0.6044), (0.02, -0.7033),
    (0.03, -0.7176), (0.05, -0.8181), (0.075, -1.0277), (0.1, -1.1917), (0.15, -1.294),
    (0.2, -1.3089), (0.3, -1.3241), (0.4, -1.3241), (0.5, -1.3241), (0.6, -1.3241),
    (0.7, -1.3241), (0.8, -1.3241), (0.9, -1.6648), (1.0, -2.1734),
)


def jacobians(model: torch.nn.Module, inputs: dict[str, Tensor], tokens: Sequence[int],
              layers: Sequence[int] | None = None, final_norm: bool = False
              ) -> list[tuple[int, int, Tensor]]:
    """(layer, token, J^l_tt (d, d) float32) for every layer (1-based, default all) and token
    of the first prompt of ``inputs``."""
    spec = find_blocks(model)
    cap = capture(model, inputs, spec, final_norm=final_norm)
    out = []
    for layer in layers or range(1, spec.num_layers + 1):
        fast = (fastpath.token_branches(model, cap, layer, 0, list(tokens), verify=False)
                if spec.causal else None)
        if fast is not None:
            out += [(layer, int(t), fast[int(t)].jacobian().detach()) for t in tokens]
            continue
        f, x = residual_branch(model, cap, layer, 0)
        J = jacobian_blocks(f, x, list(tokens), in_tokens=list(tokens))  # (T, T, d, d)
        out += [(layer, int(t), J[i, i].detach()) for i, t in enumerate(tokens)]
    return out


def decay_summary(s: Tensor) -> dict[str, Any]:
    """The decay of one spectrum s (d,) (any order): module docstring."""
    s = s.double().sort(descending=True).values
    d = int(s.shape[0])
    s1 = float(s[0])
    out: dict[str, Any] = {"d": d, "s1": s1}
    out["rel"] = {f"{f:g}": float(s[max(1, round(f * d)) - 1] / s1) for f in FRACTIONS}
    gaps = {}
    for k in KS:
        p = k + ITER_EXTRA
        if p + 1 <= d // 2:  # the head of the spectrum: past d / 2 the ratio is the tail's
            gaps[str(k)] = float(s[p] / s[k - 1])
    out["gap"] = gaps  # s_{p+1} / s_K
    q = s / s.sum()
    ent = -(q[q > 0] * q[q > 0].log()).sum()
    out["eff_rank_over_d"] = float(ent.exp()) / d
    out["stable_rank_over_d"] = float((s * s).sum() / s1**2) / d
    return out


def profile_points(s: Tensor, n: int = 64) -> list[tuple[float, float]]:
    """(i / d, log(s_i / s_1)) of one spectrum at ``n`` points, denser at the head (log-spaced
    in i): what `TRAINED_PROFILE` is the median of."""
    s = s.double().sort(descending=True).values
    d = int(s.shape[0])
    idx = sorted({max(1, min(d, round(math.exp(v))))
                  for v in torch.linspace(0, math.log(d), n).tolist()})
    return [((i - 1) / d if i > 1 else 0.0, float((s[i - 1] / s[0]).log())) for i in idx]


def profile(x: Tensor, table: Sequence[tuple[float, float]] = TRAINED_PROFILE) -> Tensor:
    """`TRAINED_PROFILE` (log s / s_1) at x in [0, 1], linear between its points."""
    xs = torch.tensor([p[0] for p in table], dtype=torch.float64, device=x.device)
    ys = torch.tensor([p[1] for p in table], dtype=torch.float64, device=x.device)
    x = x.double().clamp(0, 1)
    j = torch.searchsorted(xs, x, right=True).clamp(1, len(table) - 1)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _haar_columns(m: int, r: int, gen: torch.Generator, device: torch.device) -> Tensor:
    """m x r orthonormal columns: the Q factor of a seeded Gaussian matrix (signs fixed by R's
    diagonal, so the distribution is Haar)."""
    G = torch.randn(m, r, generator=gen, device=device)
    Q, R = torch.linalg.qr(G)
    return Q * torch.sign(torch.diagonal(R)).where(torch.diagonal(R) != 0, 1.0)


@torch.no_grad()
def realistic_(model: torch.nn.Module, seed: int = 0,
               table: Sequence[tuple[float, float]] = WEIGHT_PROFILE) -> torch.nn.Module:
    """Give every 2-D weight matrix in ``model``'s blocks the trained decay, in place (module
    docstring); returns the model. Deterministic per seed and device."""
    spec = find_blocks(model)
    blocks = get_blocks(model, spec)
    # the pre-activations' scale of the calibration width (module docstring)
    width = float(spec.hidden_size or REF_WIDTH)
    scale = math.sqrt(REF_WIDTH / width)
    n_mat = 0
    for block in blocks:
        for _name, p in sorted(block.named_parameters()):
            if p.ndim != 2 or min(p.shape) < 2:
                continue
            m, n = int(p.shape[0]), int(p.shape[1])
            r = min(m, n)
            gen = torch.Generator(device=p.device)
            gen.manual_seed(seed * 100_003 + n_mat)
            n_mat += 1
            U = _haar_columns(m, r, gen, p.device)
            V = _haar_columns(n, r, gen, p.device)
            x = torch.arange(r, device=p.device, dtype=torch.float64) / r
            s = profile(x, table).exp()
            s = s * (scale * float(p.float().norm()) / float(s.norm()))
            p.copy_(((U * s.float()) @ V.mT).to(p.dtype))
    return model


#: Llama shapes (``llama-<shape>`` in `build`): width, MLP width, heads, kv heads, layers
LLAMA_SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "8b": (4096, 14336, 32, 8, 32),  # Llama-3-8B
    "1b": (2048, 8192, 32, 8, 16),  # Llama-3.2-1B
    "mid": (1024, 3584, 16, 4, 4),  # the Llama-3-8B ratios at a width one CPU core measures in seconds
    "small": (256, 512, 8, 2, 4),  # the CPU smoke tests
    # the 8B block count and head layout at a width where compute is nearly nothing: what is
    # left is the host's work per block (Python, operator dispatch), which a GPU also pays
    "host": (128, 448, 16, 4, 32),
}
#: `build`'s names
MODELS: tuple[str, ...] = ("gpt2", "gpt2-small", *(f"llama-{s}" for s in LLAMA_SHAPES))


def llama_config(shape: str, layers: int | None = None, vocab_size: int | None = None) -> Any:
    """The ``LlamaConfig`` of `LLAMA_SHAPES`' ``shape`` with ``layers`` blocks (default the
    shape's); at d = 4096 Llama-3's vocabulary (128,256), context and rope base, else a
    vocabulary of 1,000 (``vocab_size`` overrides either)."""
    import transformers as tf

    d, width, heads, kv, n_layers = LLAMA_SHAPES[shape]
    extra: dict[str, Any] = ({"vocab_size": 128256, "max_position_embeddings": 8192,
                              "rope_theta": 500000.0} if d == 4096 else {"vocab_size": 1000})
    if vocab_size is not None:
        extra["vocab_size"] = vocab_size
    return tf.LlamaConfig(hidden_size=d, intermediate_size=width,
                          num_hidden_layers=layers or n_layers, num_attention_heads=heads,
                          num_key_value_heads=kv, **extra)


def build(name: str, spectrum: str, device: str | torch.device = "cpu",
          layers: int | None = None, weights: torch.dtype = torch.float32,
          vocab_size: int | None = None, seed: int = 0) -> torch.nn.Module:
    """A random benchmark model (`MODELS`), ``spectrum`` flat (the default initialisation)
    or trained (`realistic_`, applied in float32 on ``device``, then the weights are cast to
    ``weights``): ``gpt2`` (GPT-2-small, d = 768, 12 layers), ``gpt2-small`` (d = 256, 4
    layers), ``llama-<shape>`` (`llama_config`). ``vocab_size``: default 1,000 (Llama-3's at
    d = 4096)."""
    import transformers as tf

    if spectrum not in SPECTRA:
        raise SystemExit(f"--spectrum must be one of {', '.join(SPECTRA)}, not {spectrum!r}")
    if name.startswith("gpt2"):
        small = {"n_embd": 256, "n_head": 4} if name == "gpt2-small" else {}
        cfg = tf.GPT2Config(n_layer=layers or (4 if small else 12),
                            vocab_size=vocab_size or 1000, **small)
        cls: Any = tf.GPT2LMHeadModel
    else:
        cfg = llama_config(name.removeprefix("llama-"), layers, vocab_size)
        cls = tf.LlamaForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(cfg)
    if spectrum == "trained":
        realistic_(model, seed)
    return model.to(weights).eval()
