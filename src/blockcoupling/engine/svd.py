"""Top-K singular value decompositions: exact (dense, batched) and randomized (matrix-free).

Convention: ``J = U S V^T`` with singular values in descending order; the top-K parts are
``U (..., d, K)``, ``S (..., K)``, ``V (..., d, K)``. The sign of each singular pair
(u_i, v_i) is arbitrary; every coupling quantity is invariant under flipping both u_i and v_i.

The randomized routine follows Halko, Martinsson & Tropp (2011), "Finding structure with
randomness", algorithm 4.4 (randomized subspace iteration with QR re-orthonormalisation after
every operator application) followed by the Rayleigh-Ritz step ``B = Q^T J`` and a small SVD.
By construction ``J^T u_i = s_i v_i`` holds exactly (up to rounding) for the returned triplets,
because U lies in the sketched range Q and ``V S = J^T U`` is what was computed. The one
informative residual is therefore ``max_i ||J v_i - s_i u_i||_2 / s_1``, which costs one extra
operator application (on K vectors) and is reported as ``TopK.residual``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from blockcoupling.errors import BlockCouplingError, NumericalError


@dataclass
class TopK:
    """Top-K singular triplets of one or a batch of matrices.

    U (..., d, K) left singular vectors; S (..., K) singular values, descending;
    V (..., d, K) right singular vectors; residual (...,) ``max_i ||J v_i - s_i u_i|| / s_1``
    (None for the exact SVD); fro2 (...,) ``||J||_F^2``, trace (...,) ``tr(J)`` and trace2
    (...,) ``tr(J^2)`` (exact for `topk_svd` of a square J, unbiased Gaussian
    (Hutchinson) estimates from the sketch's vectors for `randomized_topk_svd`; None
    where not computed); n_iter the number of subspace iterations used (None for exact);
    route: which of `ROUTES` `topk_svd` took (None for `randomized_topk_svd`).
    """

    U: Tensor
    S: Tensor
    V: Tensor
    residual: Tensor | None = None
    fro2: Tensor | None = None
    n_iter: int | None = None
    trace: Tensor | None = None
    trace2: Tensor | None = None
    route: str | None = None

    @property
    def k(self) -> int:
        return int(self.S.shape[-1])


@runtime_checkable
class LinearOperator(Protocol):
    """A matrix-free square operator J (d x d): ``matmat(V) = J V``, ``rmatmat(U) = J^T U``."""

    d: int
    dtype: torch.dtype
    device: torch.device

    def matmat(self, V: Tensor) -> Tensor: ...  # (d, m) -> (d, m)

    def rmatmat(self, U: Tensor) -> Tensor: ...  # (d, m) -> (d, m)


class DenseOperator:
    """The operator protocol for an explicit square matrix J (d, d) (tests, dense fallback)."""

    def __init__(self, J: Tensor) -> None:
        if J.ndim != 2 or J.shape[0] != J.shape[1]:
            raise BlockCouplingError(
                f"DenseOperator needs a square (d, d) matrix, got shape {tuple(J.shape)}"
            )
        self.J = J
        self.d = int(J.shape[0])
        self.dtype = J.dtype
        self.device = J.device
        self.n_matmat = 0  # columns applied, for cost accounting in tests / diagnostics
        self.n_rmatmat = 0

    def matmat(self, V: Tensor) -> Tensor:
        self.n_matmat += int(V.shape[-1])
        return self.J @ V  # (d, m)

    def rmatmat(self, U: Tensor) -> Tensor:
        self.n_rmatmat += int(U.shape[-1])
        return self.J.mT @ U  # (d, m)


def _check_k(k: int, d: int) -> None:
    if int(k) < 1:
        raise BlockCouplingError(f"k must be at least 1, got {k}")
    if int(k) > d:
        raise BlockCouplingError(f"k={k} is larger than the matrix dimension; the maximum is k={d}")


#: Smallest kept singular value, relative to the largest, for which the Gram route is used;
#: below it (or if its U is not orthonormal to ``_GRAM_ORTH_TOL``) the full SVD is used.
_GRAM_MIN_RATIO: float = 1e-3
_GRAM_ORTH_TOL: float = 1e-6
#: Rows of J converted to float64 at a time: no float64 copy of the whole J is held.
_GRAM_ROWS: int = 256
#: Eigenvectors of the float32 Gram kept beyond k for the float64 Rayleigh-Ritz step of
#: `_topk_gram_mixed` (the near-degenerate neighbours of s_k).
_GRAM_WINDOW: int = 16
#: The backward error `_topk_gram_mixed` accepts, in float32 epsilons of s_1 s_k.
_GRAM_BACKWARD_ULPS: float = 32.0
#: `_iterated_subspace`: columns of its block beyond k + ``_GRAM_WINDOW``; the most Gram
#: products (n x n x p GEMMs) it spends; the certificate checked every that many products;
#: used (`_iterate_first`) only while n >= ``_ITER_MAX_WIDTH_RATIO`` x the block's width,
#: and on the CPU only from n >= ``_ITER_CPU_MIN_DIM``.
_ITER_OVERSAMPLE: int = 32
_ITER_MAX: int = 24
_ITER_CHECK: int = 4
_ITER_MAX_WIDTH_RATIO: int = 8
_ITER_CPU_MIN_DIM: int = 4096
#: The routes of `topk_svd`, recorded in ``TopK.route``.
ROUTES: tuple[str, ...] = ("gram-iter", "gram-eigh", "gram-f64", "svd")


_SCIPY_BLAS: list[Any] = []  # [threadpoolctl controller of scipy's BLAS] once looked up


def one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """Run scipy's and numpy's BLAS/LAPACK (OpenBLAS) on one thread for the block (nests).

    torch computes with its own OpenMP threads and scipy with OpenBLAS's pthreads; both spin
    for a while after a call, so on a machine with few cores each pool's idle-spinning threads
    steal the cores the other one computes on. The MRRR eigensolver is mostly BLAS2 and
    gains nothing from threads, while the torch work around it lost a third to a half of its
    speed to the contention (``benchmarks/bench_threads.py``, 2 cores: a 768 x 3072 x 768 GEMM
    after ``eigh`` 64 ms instead of 39; BENCHMARKS.md). Without threadpoolctl this does
    nothing."""
    if not _SCIPY_BLAS:
        try:
            import scipy.linalg  # noqa: F401  (loaded first, so its OpenBLAS is seen)
            from threadpoolctl import ThreadpoolController

            ctl = ThreadpoolController().select(internal_api="openblas")
            # numpy's and scipy's own OpenBLAS only: never a BLAS torch itself links (aarch64
            # torch wheels ship an OpenBLAS, whose threads must stay torch's)
            ours = [c.filepath for c in ctl.lib_controllers
                    if any(k in c.filepath for k in ("scipy", "numpy"))]
            _SCIPY_BLAS.append(ctl.select(filepath=ours) if ours else None)
        except Exception:  # not installed, or an unknown BLAS set-up: leave the threads alone
            _SCIPY_BLAS.append(None)
    ctl = _SCIPY_BLAS[0]
    return ctl.limit(limits=1) if ctl is not None and ctl.lib_controllers else (
        contextlib.nullcontext())


def _topk_gram(J: Tensor, k: int) -> tuple[tuple[Tensor, Tensor, Tensor], str] | None:
    """Top-k SVD of a float32 matrix J (m, n) from the top-k eigenpairs of its Gram matrix
    ``J^T J``, and the route taken: the mixed-precision route (`_topk_gram_mixed`, routes
    ``"gram-iter"`` and ``"gram-eigh"``) where its certificate holds, else the float64 one
    (`_topk_gram_f64`, ``"gram-f64"``). None where neither is accurate (then the caller uses
    the full SVD)."""
    got = _topk_gram_mixed(J, k)
    if got is not None:
        return got
    f64 = _topk_gram_f64(J, k)
    return (f64, "gram-f64") if f64 is not None else None


def _top_eigh(G: Tensor, w: int, subset: bool | None = None) -> tuple[Tensor, Tensor] | None:
    """The top ``w`` eigenpairs (ascending) of a symmetric G (n, n), on G's device and dtype.

    ``subset`` (default: G is on the CPU): LAPACK's MRRR on that subset of the spectrum
    (``scipy.linalg.eigh``; G is overwritten); else (a GPU) the full ``torch.linalg.eigh`` of
    G, sliced: GPU solvers have no subset driver, and a full one is still a fraction of a full
    SVD's time there (BENCHMARKS.md, the GPU rows). None where the solver did not return w
    pairs."""
    n = int(G.shape[-1])
    if subset if subset is not None else G.device.type == "cpu":
        import scipy.linalg

        with one_blas_thread():
            w_, Q_ = scipy.linalg.eigh(G.numpy(), subset_by_index=[n - w, n - 1], driver="evr",
                                       overwrite_a=True, check_finite=False)
        vals, Q = torch.from_numpy(w_), torch.from_numpy(Q_)
    else:
        vals, Q = torch.linalg.eigh(G)
        vals, Q = vals[n - w:], Q[:, n - w:]
    return (vals, Q) if Q.shape == (n, w) else None


def _row_blocks(m: int) -> list[slice]:
    return [slice(s, min(s + _GRAM_ROWS, m)) for s in range(0, m, _GRAM_ROWS)]


def _accurate(U: Tensor, S: Tensor) -> bool:
    """The Gram routes' own checks: s_k / s_1 not below ``_GRAM_MIN_RATIO`` (the squared
    spectrum would lose digits) and U = J V / S orthonormal to ``_GRAM_ORTH_TOL``."""
    if not bool(S[-1] >= _GRAM_MIN_RATIO * S[0]) or not bool(S[0] > 0):
        return False
    k = int(S.shape[0])
    eye = torch.eye(k, dtype=U.dtype, device=U.device)
    return bool((U.mT @ U - eye).abs().max() <= _GRAM_ORTH_TOL)


def _topk_gram_mixed(J: Tensor, k: int) -> tuple[tuple[Tensor, Tensor, Tensor], str] | None:
    """Top-k SVD of a float32 J (m, n): a float32 subspace, float64 Ritz pairs, certified.

    1. a float32 subspace that holds the top k eigenvectors of the float32 Gram ``J^T J``:
       where `_iterate_first` says so (k << n, on a GPU or on a CPU from n = 4096), block
       subspace iteration on the Gram (`_iterated_subspace`, route ``"gram-iter"``),
       certified every ``_ITER_CHECK`` products; else, or where that certificate does not
       hold, the top
       ``w = k + _GRAM_WINDOW`` eigenvectors of the Gram (LAPACK MRRR on a subset on the CPU,
       the full ``torch.linalg.eigh`` elsewhere, `_top_eigh`; route ``"gram-eigh"``; float32
       halves the tridiagonalisation, which is nearly all of an eigensolver's time);
    2. Rayleigh-Ritz in float64 on that span W (`_ritz64`): ``H = W^T (J^T (J W))`` from
       float64 row blocks of J, its eigenpairs (theta, Y), ``V = W Y``, ``S = sqrt(theta)``,
       ``U = (J W) Y / S``. The window resolves the near-degenerate neighbours of s_k, whose
       mixing float32 cannot settle, exactly in float64;
    3. the certificate: with ``R = J^T J V - V diag(theta)`` and V orthonormal, the pairs
       are exact eigenpairs of ``J^T J + E`` with ``||E||_2 <= 2 ||R||_2``. Accepted while
       ``2 ||R||_2 <= _GRAM_BACKWARD_ULPS * eps32 * s_1 s_k``: E then moves s_k by at most
       ``_GRAM_BACKWARD_ULPS / 2 * eps32 * s_1``, a few float32 roundings of J, the
       perturbation J carries anyway (``||(J + dJ)^T (J + dJ) - J^T J||`` was 3-4e-7 s_1^2
       on GPT-2-small-shaped random blocks, ``||R||_2`` 4e-7 s_1^2 with s_k / s_1 = 0.8-0.9;
       BENCHMARKS.md). Else None: a small s_k / s_1 fails it, as squaring the spectrum in
       float32 would lose its digits.

    Returns the triplets and the route that gave them.
    """
    n = int(J.shape[-1])
    w = min(n, int(k) + _GRAM_WINDOW)
    J = J.detach()
    G32 = J.mT @ J  # (n, n) float32, used only to find the subspace
    if not bool(torch.isfinite(G32).all()):  # float32 overflow: the float64 route
        return None
    if _iterate_first(n, int(k), G32.device):
        got = _iterated_subspace(J, G32, int(k))
        if got is not None:
            return got, "gram-iter"
    top = _top_eigh(G32, w)  # (n, w), ascending
    if top is None:
        return None
    cert = _ritz64(J, torch.linalg.qr(top[1].double()).Q, int(k))
    return (cert[0], "gram-eigh") if cert[0] is not None else None


Ritz = tuple[tuple[Tensor, Tensor, Tensor] | None, float, float]


def _ritz64(J: Tensor, W: Tensor, k: int) -> Ritz:
    """Steps 2-3 of `_topk_gram_mixed` on an orthonormal float64 basis W (n, w), w >= k:
    the certified top-k triplets of J (m, n) in J's dtype (None where the certificate or
    `_accurate` fails), the certificate's ratio ``2 ||R||_2 / bound`` (<= 1: it holds), and
    ``theta_w / theta_k``, the smallest Ritz value over the k-th (the Ritz estimate of the
    rate at which subspace iteration on span(W) converges to the k-th eigenvector)."""
    m, n = int(J.shape[-2]), int(J.shape[-1])
    w = int(W.shape[-1])
    JW = torch.empty(m, w, dtype=torch.float64, device=J.device)
    GW = torch.zeros(n, w, dtype=torch.float64, device=J.device)  # J^T J W
    for c in _row_blocks(m):
        Jc = J[c].double()  # (rows, n)
        torch.mm(Jc, W, out=JW[c])
        GW.addmm_(Jc.mT, JW[c])
    H = W.mT @ GW  # (w, w)
    theta, Y = torch.linalg.eigh((H + H.mT) / 2)  # ascending
    decay = float(theta[0].clamp_min(0) / theta[-k]) if bool(theta[-k] > 0) else 1.0
    theta, Y = theta[-k:].flip(0), Y[:, -k:].flip(1)  # (k,), (w, k)
    V = W @ Y  # (n, k)
    S = theta.clamp_min(0).sqrt()
    R = GW @ Y - V * theta  # (n, k)
    r2 = float(torch.linalg.eigvalsh(R.mT @ R)[-1].clamp_min(0).sqrt())  # ||R||_2
    eps32 = float(torch.finfo(torch.float32).eps)
    bound = _GRAM_BACKWARD_ULPS * eps32 * float((theta[0] * theta[-1]).clamp_min(0).sqrt())
    ratio = 2 * r2 / bound if bound > 0 else float("inf")
    if not ratio <= 1:
        return None, ratio, decay
    U = (JW @ Y) / S  # (m, k)
    if not _accurate(U, S):
        return None, ratio, decay
    return (U.to(J.dtype), S.to(J.dtype), V.to(J.dtype)), ratio, decay


def _iter_width(n: int, k: int) -> int:
    """Columns of `_iterated_subspace`'s block: k, the window, the oversampling."""
    return min(n, int(k) + _GRAM_WINDOW + _ITER_OVERSAMPLE)


def _iterate_first(n: int, k: int, device: torch.device) -> bool:
    """THE rule for the Gram route's subspace: iterate first (`_iterated_subspace`) while
    the block is at most ``1 / _ITER_MAX_WIDTH_RATIO`` of the dimension, on any device but
    the CPU, and on the CPU from ``n >= _ITER_CPU_MIN_DIM``. A GPU has no subset driver (its
    full eigh took 0.10 s per 4096 x 4096 Gram on an H200); on the CPU LAPACK's subset MRRR
    costs about n^3 and the iteration about n^2 p per product: one thread, on random,
    trained-spectrum and decaying J, the iteration took 0.55-1.8x MRRR's time at n = 768-1024
    where it certified (1.2-1.8x where it gave up), 0.56-0.85x at n = 2048 (but 1.09-1.37x where it gave up, 7 cases of
    12), and at n = 4096 0.17-0.44x where it certified, 0.96-1.10x where it gave up: 63 s
    against 107 s over the 15 blocks measured (BENCHMARKS.md, "Issue 43 items 1-2")."""
    if device.type == "cpu" and n < _ITER_CPU_MIN_DIM:
        return False
    return _ITER_MAX_WIDTH_RATIO * _iter_width(n, k) <= n


def _iterated_subspace(J: Tensor, G32: Tensor, k: int
                       ) -> tuple[Tensor, Tensor, Tensor] | None:
    """The certified top-k triplets of J from block subspace iteration on its float32 Gram
    G32 (n, n) (Halko, Martinsson & Tropp 2011, alg. 4.4, on a symmetric matrix): a seeded
    Gaussian block X (n, p), ``p = _iter_width(n, k)``, then ``X = qr(G32 X).Q`` at most
    ``_ITER_MAX`` times; every ``_ITER_CHECK`` products the float64 Rayleigh-Ritz step and
    the certificate of `_topk_gram_mixed` on span(X) (`_ritz64`). The angle of the i-th
    eigenvector to span(X) shrinks like ``(lambda_{p+1} / lambda_i)^q``, so a decaying
    spectrum is certified in a few products and a flat one never: None (the caller then
    decomposes the whole Gram) as soon as the certificate's ratio would not reach 1 within
    the products left, at the rate the Ritz values predict (``(theta_p / theta_k)`` per
    product, `_ritz64`) or, from the second check on, at the rate it fell since the last."""
    n = int(G32.shape[-1])
    p = _iter_width(n, k)
    gen = torch.Generator(device=G32.device)
    gen.manual_seed(0)
    X = torch.randn(n, p, generator=gen, dtype=G32.dtype, device=G32.device)
    last = float("inf")
    for it in range(1, _ITER_MAX + 1):
        X = torch.linalg.qr(G32 @ X).Q  # (n, p)
        if it % _ITER_CHECK and it != _ITER_MAX:
            continue
        got, ratio, decay = _ritz64(J, torch.linalg.qr(X.double()).Q, k)
        if got is not None or ratio <= 1:  # certified, or certified but not `_accurate`
            return got
        if ratio == float("inf"):  # s_k = 0: no bound to reach
            return None
        checks_left = (_ITER_MAX - it) // _ITER_CHECK
        rate = ratio / last  # per check, observed (0 at the first check)
        if (checks_left == 0 or ratio * decay ** (_ITER_MAX - it) > 1
                or ratio * rate**checks_left > 1):
            return None
        last = ratio
    return None


def _topk_gram_f64(J: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor] | None:
    """Top-k SVD of a matrix J (m, n) from the top-k eigenpairs of the float64 Gram matrix
    ``J^T J`` (`_top_eigh`: LAPACK MRRR on a subset of the spectrum on the CPU), then
    ``U = J V / S`` in float64 (both from float64 blocks of ``_GRAM_ROWS`` rows of J). None
    where that is not accurate (see ``_GRAM_MIN_RATIO``).

    In float64 the Gram matrix's rounding (~1e-16 s_1^2) moves s_i by ~1e-16 s_1^2 / s_i and
    the vectors by ~1e-16 s_1^2 / gap: below float32 rounding while s_k / s_1 >= 1e-3, so for a
    float32 J this is at least as exact as ``torch.linalg.svd`` of it, and 2-3x faster for
    k << n (no bidiagonalisation, eigenvectors only for the k wanted values).
    """
    m, n = int(J.shape[-2]), int(J.shape[-1])
    J = J.detach()
    rows = _row_blocks(m)
    G = torch.zeros(n, n, dtype=torch.float64, device=J.device)  # J^T J, float64 row blocks
    for c in rows:
        Jc = J[c].double()  # (rows, n)
        G.addmm_(Jc.mT, Jc)
    top = _top_eigh(G, k)  # ascending; G is ours
    if top is None:
        return None
    V = top[1].flip(-1).contiguous()  # (n, k)
    S = top[0].flip(-1).clamp_min(0).sqrt()  # (k,)
    U = torch.cat([J[c].double() @ V for c in rows]) / S  # (m, k)
    if not _accurate(U, S):
        return None
    return U.to(J.dtype), S.to(J.dtype), V.to(J.dtype)


def topk_svd(J: Tensor, k: int) -> TopK:
    """Exact top-k SVD of J (..., m, n), batched over leading dims.

    Returns U (..., m, k), S (..., k), V (..., n, k), fro2 = ||J||_F^2 (...,) exactly,
    residual None; for a square J also ``trace = tr(J)`` and ``trace2 = tr(J^2)`` (...,)
    exactly (``sum_ij J_ij J_ji``: O(d^2), no product), for the rotated-basis null. A single
    float32 matrix with ``4 k <= min(m, n)``, on any device, goes the Gram route
    (`_topk_gram`: the top-k eigenpairs of ``J^T J``, certified, where accurate); everything
    else ``torch.linalg.svd``. ``route`` says which (`ROUTES`). Raises `BlockCouplingError` if
    k > min(m, n) and `NumericalError` if J holds NaN or infinity.
    """
    if J.ndim < 2:
        raise BlockCouplingError(f"topk_svd needs a matrix (..., m, n), got shape {tuple(J.shape)}")
    _check_k(k, min(int(J.shape[-2]), int(J.shape[-1])))
    fro2 = torch.linalg.vector_norm(J, dim=(-2, -1)) ** 2  # (...,)
    if not (bool(torch.isfinite(fro2).all()) or bool(torch.isfinite(J).all())):
        raise NumericalError(
            "the Jacobian contains NaN or infinity; check the model's hidden states and dtype"
        )
    trace, trace2 = _traces(J)
    if (J.ndim == 2 and J.dtype == torch.float32
            and 4 * int(k) <= min(int(J.shape[0]), int(J.shape[1]))):
        got = _topk_gram(J, int(k))
        if got is not None:
            (U, S, V), route = got
            return TopK(U=U, S=S, V=V, residual=None, fro2=fro2, n_iter=None, trace=trace,
                        trace2=trace2, route=route)
    U, S, Vh = torch.linalg.svd(J, full_matrices=False)  # (..., m, r), (..., r), (..., r, n)
    return TopK(
        U=U[..., :k],
        S=S[..., :k],
        V=Vh[..., :k, :].mT,
        residual=None,
        fro2=fro2,
        n_iter=None,
        trace=trace,
        trace2=trace2,
        route="svd",
    )


def _traces(J: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """``tr(J)`` and ``tr(J^2) = sum_ij J_ij J_ji`` of a square J (..., d, d), else None."""
    if J.shape[-1] != J.shape[-2]:
        return None, None
    trace = torch.diagonal(J, dim1=-2, dim2=-1).sum(-1)  # (...,)
    trace2 = (J * J.mT).sum((-2, -1))  # (...,)
    return trace, trace2


def _orth(Y: Tensor) -> Tensor:
    """Orthonormal basis of the columns of Y (d, m) by reduced QR."""
    return torch.linalg.qr(Y, mode="reduced").Q


def _residual(JV: Tensor, U: Tensor, S: Tensor) -> Tensor:
    """``max_i ||J v_i - s_i u_i|| / s_1`` (0-d tensor); 0 when J v = 0 and s_1 = 0."""
    num = torch.linalg.vector_norm(JV - U * S, dim=0).max()
    s1 = S[0]
    return torch.where(s1 > 0, num / torch.where(s1 > 0, s1, torch.ones_like(s1)), num)


def randomized_topk_svd(
    op: LinearOperator,
    k: int,
    *,
    oversample: int = 10,
    n_iter: int = 4,
    tol: float | None = None,
    seed: int = 0,
    max_iter: int = 30,
    trace2: bool = False,
) -> TopK:
    """Top-k SVD of a matrix-free operator by randomized subspace iteration.

    op: anything with ``d``, ``dtype``, ``device``, ``matmat(V) = J V`` and
    ``rmatmat(U) = J^T U`` for (d, m) blocks. A Gaussian test matrix Omega (d, m) with
    ``m = min(k + oversample, d)`` is drawn from a ``torch.Generator`` seeded with ``seed`` on
    the op's device (deterministic under the seed); ``Q = orth(J Omega)``; then ``n_iter`` times
    ``Q = orth(J orth(J^T Q))``; then ``B = Q^T J`` and ``B = Ub S V^T`` gives ``U = Q Ub``.

    The residual ``max_i ||J v_i - s_i u_i||_2 / s_1`` is computed with one extra ``matmat`` on
    the k right vectors. When ``tol`` is given and the residual exceeds it, further subspace
    iterations are run (each costs m + m + k operator columns) until it is below ``tol`` or
    ``max_iter`` iterations in total have been done; the result then carries the last
    residual (no error: the caller records it). ``fro2`` is ``||J Omega||_F^2 / m``, an unbiased
    estimate of ``||J||_F^2`` (its relative standard deviation is at most sqrt(2/m), smaller
    when the spectrum is flat). ``trace`` is the Hutchinson estimate ``sum_j w_j^T J w_j / m``
    over the same m Gaussian columns w_j of Omega (no extra product: ``J Omega`` is the
    sketch; variance ``2 ||(J + J^T)/2||_F^2 / m``). With ``trace2=True``, ``tr(J^2)`` is
    estimated the same way, ``sum_j (J^T w_j)^T (J w_j) / m``, at the cost of one more
    ``rmatmat`` of the m columns (only the rotated-basis null needs it); else None.

    Cost: ``(n_iter + 1) * m`` matmat columns + ``(n_iter + 1) * m`` rmatmat columns + k
    (+ m rmatmat columns with ``trace2``).
    """
    d = int(op.d)
    _check_k(k, d)
    if oversample < 0 or n_iter < 0:
        raise BlockCouplingError("oversample and n_iter must be non-negative")
    if tol is not None and not tol > 0:
        raise BlockCouplingError(f"tol must be positive, got {tol}")
    m = min(int(k) + int(oversample), d)
    device = torch.device(op.device)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    omega = torch.randn(d, m, generator=gen, dtype=op.dtype, device=device)  # (d, m)

    Y = op.matmat(omega)  # (d, m)
    if not bool(torch.isfinite(Y).all()):
        raise NumericalError(
            "the Jacobian operator returned NaN or infinity; check the model's hidden states and dtype"
        )
    fro2 = (Y * Y).sum() / m
    trace = (omega * Y).sum() / m  # Hutchinson on the sketch's own vectors
    tr2 = (op.rmatmat(omega) * Y).sum() / m if trace2 else None
    Q = _orth(Y)  # (d, m)
    for _ in range(int(n_iter)):
        Q = _orth(op.matmat(_orth(op.rmatmat(Q))))
    it = int(n_iter)
    while True:
        Bt = op.rmatmat(Q)  # (d, m) = J^T Q = B^T
        Ub, S, Vh = torch.linalg.svd(Bt.mT, full_matrices=False)  # (m, m), (m,), (m, d)
        U = Q @ Ub[:, :k]  # (d, k)
        S = S[:k]  # (k,)
        V = Vh[:k].mT  # (d, k)
        res = _residual(op.matmat(V), U, S)
        if tol is None or bool(res <= tol) or it >= max_iter:
            break
        Q = _orth(op.matmat(_orth(Bt)))  # one more subspace iteration, reusing J^T Q
        it += 1
    return TopK(U=U, S=S, V=V, residual=res, fro2=fro2, n_iter=it, trace=trace, trace2=tr2)
