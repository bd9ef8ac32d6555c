"""The float64 oracles: each block's call recorded by hooks of our own, dense Jacobians by
``torch.autograd.functional.jacobian``, their SVDs by numpy, and the coupling formulas of
DEFINITIONS.md spelled out, independently of the package."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from blockcoupling.engine.blocks import find_blocks, get_module

TOL = 1e-8


# ---------------------------------------------------------------------------- the oracle
def oracle_calls(model: torch.nn.Module, inputs: dict,
                 blocks_path: str | None = None) -> tuple[list, list, list]:
    """Each block's (args, kwargs), input and output, recorded by hooks of our own (at
    ``blocks_path``, else where find_blocks says)."""
    blocks = get_module(model, blocks_path or find_blocks(model).blocks_path)
    calls, ins, outs, handles = [], [], [], []
    for blk in blocks:
        def pre(mod, args, kwargs):
            calls.append((args, dict(kwargs)))
            ins.append(args[0] if args else kwargs["hidden_states"])

        def post(mod, args, kwargs, out):
            outs.append(out[0] if isinstance(out, tuple) else out)

        handles += [blk.register_forward_pre_hook(pre, with_kwargs=True),
                    blk.register_forward_hook(post, with_kwargs=True)]
    try:
        with torch.no_grad():
            model(**inputs, **({"use_cache": False} if "input_ids" in inputs else {}))
    finally:
        for h in handles:
            h.remove()
    return calls, ins, outs


def oracle_jacobians(model, inputs, blocks_path: str | None = None
                     ) -> tuple[list[np.ndarray], np.ndarray]:
    """J[l][t2, t1] = d f^l(X)_{t2} / d x_{t1} (d x d), and the trajectory X (L+1, n, d)."""
    calls, ins, outs = oracle_calls(model, inputs, blocks_path)
    blocks = get_module(model, blocks_path or find_blocks(model).blocks_path)
    Js = []
    for blk, (args, kwargs), x in zip(blocks, calls, ins, strict=True):
        def f(X, blk=blk, args=args, kwargs=kwargs):
            kw = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            out = blk(X[None], *args[1:], **kw)
            out = out[0] if isinstance(out, tuple) else out
            return out[0] - X

        J = torch.autograd.functional.jacobian(f, x[0].detach())  # (n, d, n, d)
        Js.append(J.permute(0, 2, 1, 3).numpy())  # (t_out, t_in, d_out, d_in)
    X = torch.stack([ins[0][0]] + [o[0] for o in outs]).detach().numpy()
    return Js, X


def oracle_value(J1: np.ndarray, J2: np.ndarray, k: int, variant: str, p: float,
                 orientation: str, svd: dict | None = None) -> float:
    svd = {} if svd is None else svd  # memo of numpy SVDs by matrix identity
    for J in (J1, J2):
        if id(J) not in svd:
            svd[id(J)] = (J, np.linalg.svd(J))
    S1 = svd[id(J1)][1][1]
    U2, S2, V2t = svd[id(J2)][1]
    U2k, V2k = U2[:, :k], V2t[:k].T
    A = U2k.T @ J1 @ V2k if orientation == "ujv" else V2k.T @ J1 @ U2k
    s = S1[:k]
    S = np.diag(s)
    pn = {1.0: np.sum(np.abs(s)), 2.0: np.sqrt(np.sum(s ** 2)), math.inf: np.max(np.abs(s))}
    if variant in ("coupling_vs_null", "coupling_vs_rotated"):
        p = 1.0  # stored once with p empty, computed with p = 1 (the value does not depend on p)
    if variant == "coupling_vs_rotated":
        return 1 - np.linalg.norm(A - S) / oracle_rotated_rms(J1, U2k, V2k, s)
    if variant in ("miscoupling", "coupling", "coupling_vs_null"):
        m = np.linalg.norm(A - S) / pn[p]
        if variant == "miscoupling":
            return m
        c = 1 - m
        if variant == "coupling":
            return c
        d = J1.shape[0]
        c_null = 1 - np.sqrt((k / d) ** 2 * np.sum(J1 ** 2) + np.sum(s ** 2)) / pn[p]
        return (c - c_null) / (1 - c_null)
    if variant == "released_norm":
        return np.linalg.norm(np.abs(A) - S) / np.sqrt(np.sum(s ** 2))
    if variant == "released_trace":
        return np.linalg.norm(np.abs(A) - S) / np.sum(s)
    if variant == "offdiag_ratio":
        return np.linalg.norm(A - np.diag(np.diag(A))) / np.linalg.norm(A)
    raise AssertionError(variant)


def oracle_rotated_rms(J1: np.ndarray, U2k: np.ndarray, V2k: np.ndarray, s: np.ndarray
                       ) -> float:
    """sqrt(E_R ||(R U2)^T J1 (R V2) - diag(s)||_F^2) over Haar R, from the second moments
    E[Y_ij Y_kl] = a d_ik d_jl + b d_il d_jk + c d_ij d_kl of Y = R^T J0 R (J0 = J1 - tau I),
    their three equations solved numerically (test_variants.py checks the expectation by
    Monte Carlo)."""
    d, k = J1.shape[0], len(s)
    tau = np.trace(J1) / d
    J0 = J1 - tau * np.eye(d)
    a, b, c = np.linalg.solve([[1, 1, d], [d * d, d, d], [d, d * d, d]],
                              [0.0, np.sum(J0 ** 2), np.trace(J0 @ J0)])
    M = U2k.T @ V2k
    e2 = (np.sum(s ** 2) - 2 * tau * np.sum(s * np.diag(M)) + tau ** 2 * np.sum(M ** 2)
          + a * k * k + (b + c) * np.sum(M ** 2))
    return float(np.sqrt(e2))


def check_diagnostics(diag: pd.DataFrame, Js: list[np.ndarray], k: int) -> int:
    """The isotropy columns of every measured Jacobian against numpy."""
    checked = 0
    for row in diag.itertuples(index=False):
        J = Js[row.layer - 1][row.token_out, row.token_in]
        d = J.shape[0]
        U, _, Vt = np.linalg.svd(J)
        tr = np.trace(J)
        assert row.trace_over_d == pytest.approx(tr / d, rel=1e-8, abs=1e-12)
        assert row.isotropic_share == pytest.approx(tr ** 2 / (d * np.sum(J ** 2)), rel=1e-8,
                                                    abs=1e-12)
        overlap = np.sum((U[:, :k].T @ Vt[:k].T) ** 2) / k
        assert row.uv_overlap == pytest.approx(overlap, rel=1e-7, abs=1e-10)
        checked += 1
    return checked


def check_coupling_table(df: pd.DataFrame, Js: list[np.ndarray], tol: float = TOL) -> int:
    checked = 0
    memo: dict = {}
    for row in df.itertuples(index=False):
        J1 = Js[row.layer_a - 1][row.token_out_a, row.token_in_a]  # array[t2, t1] or dict
        J2 = Js[row.layer_b - 1][row.token_out_b, row.token_in_b]
        p = 2.0 if row.variant == "released_norm" else (None if pd.isna(row.p) else float(row.p))
        want = oracle_value(J1, J2, row.k, row.variant, p, row.orientation, memo)
        assert abs(row.value - want) < tol * max(1.0, abs(want)), (row, want)
        checked += 1
    return checked


def call_block_oracle(
    block: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], hidden: int | str
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Straightforward oracle: ``h (1, n, d) -> block(h, recorded call)[0] - h``."""

    def g(h: torch.Tensor) -> torch.Tensor:
        if isinstance(hidden, int):
            a = args[:hidden] + (h,) + args[hidden + 1 :]
            out = block(*a, **kwargs)
        else:
            out = block(*args, **{**kwargs, hidden: h})
        out = out[0] if isinstance(out, tuple) else out
        return out - h

    return g


def largest_sign(scores: np.ndarray, rtol: float = 1e-9) -> float | None:
    """The PCA sign convention (scikit-learn's ``svd_flip``): the sign of the score of largest
    absolute value; None when two scores tie within ``rtol`` (a two-token prompt's scores are
    +a and -a), where rounding, hence the host's BLAS kernel, decides the sign."""
    mag = np.sort(np.abs(scores))[::-1]
    if len(mag) > 1 and mag[0] - mag[1] <= rtol * mag[0]:
        return None
    return float(np.sign(scores[np.argmax(np.abs(scores))]))


def assert_pca_matches(got: np.ndarray, ref: np.ndarray, atol: float) -> None:
    """``got`` (L+1, n) is the PCA component ``ref`` (L+1, n) with the sign convention of
    :func:`largest_sign` on the last layer; where that layer's scores tie, up to the sign."""
    sign = largest_sign(ref[-1])
    if sign is None:
        sign = 1.0 if float(np.sum(got[-1] * ref[-1])) >= 0 else -1.0
    np.testing.assert_allclose(got, sign * ref, atol=atol)
