"""Dense ``J^l_tt`` of known decoder blocks by a few GEMMs (the block's structure, no autodiff).

The decode step at token t (`blockcoupling.engine.fastpath`) maps ``x = x_t`` to the
block output at t with the keys and values of tokens ``0..t-1`` fixed. For the pre-norm
blocks below its Jacobian is, by the chain rule (column convention, ``J = dy/dx``):

    J_n    = diag(c) - P Q^T                 a norm at its input (LayerNorm: rank 2, RMSNorm: 1)
    J_q    = R W_q J_n1,  J_k = R W_k J_n1,  J_v = W_v J_n1     (R: the rotary map at t, or I)
    J_o,h  = C_h J_q,h + c_h (q_h^T J_k,g(h)) + p_t,h J_v,g(h)  per head h (kv head g(h))
             C_h = s V_h^T (diag p_h - p_h p_h^T) K_h,  c_h = s p_t,h (v_t,h - o_h)
    J_a    = W_o J_o                                              (attention branch)
    N      = W_out diag(act'(z)) W_in J_n2                        (MLP; gated: W_d [diag(act'(g) u) W_g
                                                                    + diag(act(g)) W_u] J_n2)
    J_y    = I + J_a + N + N J_a                                  (two residual connections)
    J      = J_nf J_y - I                                         (J_nf: the folded final norm)

where ``p_h`` are the attention probabilities of token t over keys ``K_h (t+1, hd)`` / values
``V_h``, ``o_h = V_h^T p_h`` and ``s`` the score scale. Products with a norm Jacobian cost
O(d^2) (diagonal plus low rank), the per-head maps are hd x hd, so the cost is three GEMMs:
``W_o J_o`` (2 d^3), ``N`` (2 d I d, I the MLP width) and ``N J_a`` (2 d^3) -- about half the
flops of pulling back d cotangents through the decode step, as large GEMMs. Each norm
Jacobian multiplies a (d, d) product once, on the right (``(W_out diag(act') W_in) J_n2``),
rather than every weight matrix (an (I, d) pass saved per block).

The same decode step gives the cross-token blocks ``J_{s t}`` (s < t, token-wise coupling
``fixed_output`` / ``fixed_input`` and the influence): the input x_s reaches the output at t
only through the key and value of s (`OutputStep`), so each is one d^3 GEMM after a
(d, d) product shared by every s of that t, instead of d pullbacks through the whole prompt.

Supported (by class name, exactly): ``GPT2Block`` (LayerNorm, fused ``c_attn`` Conv1D,
elementwise MLP), ``LlamaDecoderLayer`` with its structural twins ``MistralDecoderLayer``
and ``Qwen2DecoderLayer`` (RMSNorm, RoPE, grouped-query attention, projection biases, gated
MLP; a sliding window enters through the sliced attention mask), and TransformerLens 3's
``TransformerBlock`` (its own LayerNorm / RMSNorm, per-head ``W_Q``/``W_K``/``W_V``/``W_O``,
learned positions, an elementwise MLP; a TransformerBridge's blocks are the HuggingFace
ones inside it). The RMSNorm of that family
computes in float32 internally, so there the structured route is used for float32 analyses
only (in float64 the module's own float32 rounding is part of the measured function). Anything else, or anything unexpected (a mask of another shape, a recomputed key that
differs from the recorded one, an output that differs from the recorded output) gives
``None`` and the caller pulls back through the decode step instead. The caller also checks the
result against the generic path once per layer (``fastpath`` verification).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import jvp

#: a transformers block or submodule read by attribute name (``block.attn.c_attn``,
#: ``norm.variance_epsilon``): ``nn.Module.__getattr__`` types those as ``Tensor | Module``,
#: so they are typed by what they are, duck-typed modules.
HFModule = Any

__all__ = ["OutputStep", "decode_step_jacobian", "output_step", "supports"]

_LLAMA_LIKE = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer")
_TL_BLOCK = "TransformerBlock"  # TransformerLens 3's block (transformer_lens.components)
_SUPPORTED = ("GPT2Block", *_LLAMA_LIKE, _TL_BLOCK)
_RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")  # w * x / rms(x)
#: TransformerLens 3's norms (w, b, eps; the Pre forms without weights)
_TL_NORMS = ("LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre")


def _from_transformer_lens(module: Any) -> bool:
    return type(module).__module__.startswith("transformer_lens.")


def supports(block: nn.Module) -> bool:
    """Whether `decode_step_jacobian` knows this block type."""
    name = type(block).__name__
    return name in _SUPPORTED and (name != _TL_BLOCK or _from_transformer_lens(block))


# ----------------------------------------------------------------------------- pieces
@dataclass
class NormJacobian:
    """Jacobian of a norm at one input: ``J = diag(c) - P Q^T`` (d, d), c (d,), P/Q (d, r)."""

    c: Tensor
    P: Tensor
    Q: Tensor

    def dense(self) -> Tensor:
        return torch.diag(self.c) - self.P @ self.Q.T  # (d, d)

    def right_of(self, W: Tensor) -> Tensor:
        """``W J`` for W (m, d), in O(m d) (one new (m, d) tensor; W is not changed)."""
        return (W * self.c).addmm_(W @ self.P, self.Q.T, alpha=-1)

    def left_of(self, M: Tensor) -> Tensor:
        """``J M`` for M (d, m), in O(d m) (one new (d, m) tensor; M is not changed)."""
        return (self.c[:, None] * M).addmm_(self.P, self.Q.T @ M, alpha=-1)


def _layer_norm(norm: HFModule, x: Tensor, gamma: Tensor | None, eps: float
                ) -> tuple[Tensor, NormJacobian]:
    """A LayerNorm (centred, scaled, times ``gamma``) at x (d,): its value and Jacobian."""
    d = x.shape[0]
    xc = x - x.mean()
    sigma = torch.sqrt((xc * xc).mean() + eps)
    xh = xc / sigma  # (d,)
    c = (gamma if gamma is not None else torch.ones_like(x)) / sigma
    P = torch.stack([c, c * xh], dim=1)  # (d, 2)
    Q = torch.stack([torch.full_like(x, 1.0 / d), xh / d], dim=1)  # (d, 2)
    return norm(x[None])[0], NormJacobian(c, P, Q)


def _rms_norm(norm: HFModule, x: Tensor, w: Tensor | None, eps: float
              ) -> tuple[Tensor, NormJacobian]:
    """An RMSNorm (x / rms(x), times ``w``) at x (d,): its value and Jacobian."""
    d = x.shape[0]
    w = w if w is not None else torch.ones_like(x)
    r = torch.sqrt((x * x).mean() + eps)
    P = (w * x / r**3)[:, None]  # (d, 1)
    Q = (x / d)[:, None]  # (d, 1)
    return norm(x[None])[0], NormJacobian(w / r, P, Q)


def norm_jacobian(norm: HFModule, x: Tensor) -> tuple[Tensor, NormJacobian] | None:
    """Value and Jacobian of ``nn.LayerNorm``, a Llama-style RMSNorm or a TransformerLens 3
    norm at x (d,); None otherwise."""
    d = x.shape[0]
    name = type(norm).__name__
    if isinstance(norm, nn.LayerNorm):
        if tuple(norm.normalized_shape) != (d,):
            return None
        return _layer_norm(norm, x, norm.weight, float(norm.eps))
    if name in _RMS_NORMS:
        if x.dtype != torch.float32:
            # the module computes in float32 whatever its dtype: in a wider analysis its own
            # rounding is part of the function, which only autodiff through it reproduces
            return None
        return _rms_norm(norm, x, norm.weight, float(norm.variance_epsilon))
    if name in _TL_NORMS and _from_transformer_lens(norm):
        if x.dtype != norm.cfg.dtype:  # it casts its normalised x to the model's dtype
            return None
        weight = getattr(norm, "w", None) if not name.endswith("Pre") else None
        if name.startswith("LayerNorm"):
            return _layer_norm(norm, x, weight, float(norm.eps))
        return _rms_norm(norm, x, weight, float(norm.eps))
    return None


def _act_and_grad(act: Callable[[Tensor], Tensor], z: Tensor) -> tuple[Tensor, Tensor]:
    """act(z) and its elementwise derivative (a JVP with a ones tangent; exact for an
    elementwise activation, which the caller's checks confirm)."""
    out = jvp(act, (z,), (torch.ones_like(z),))  # (act(z), act'(z)): no aux output
    return out[0], out[1]


def _bias(mask: Any, t: int, dtype: torch.dtype) -> Tensor | None | Literal[False]:
    """The row-t attention mask as an additive bias (t+1,), None for no mask, False if its
    shape is not understood."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.numel() != t + 1:
        return False
    m = mask.reshape(t + 1)
    if m.dtype == torch.bool or not m.is_floating_point():  # keep masks (TransformerLens' 1/0)
        return torch.where(m.bool(), 0.0, float("-inf")).to(dtype)
    return m.to(dtype)  # additive


@dataclass
class _Attention:
    """What the attention of one block needs, in matrices (rows = outputs)."""

    Wq: Tensor  # (H*hd, d)
    Wk: Tensor  # (Hkv*hd, d)
    Wv: Tensor  # (Hkv*hd, d)
    bq: Tensor | None
    bk: Tensor | None
    bv: Tensor | None
    Wo: Tensor  # (d, H*hd)
    bo: Tensor | None
    H: int
    Hkv: int
    hd: int
    scale: float
    rope: Tensor | None  # (hd, hd) rotary map at position t, or None


@dataclass
class _Attended:
    """The attention of the query token t: its value, and what its Jacobians need
    (probabilities, per-head outputs, the query, the keys and values, one per query head)."""

    val: Tensor  # (d,) the attention branch at t
    p: Tensor  # (H, t+1) attention probabilities
    o: Tensor  # (H, hd) per-head outputs
    q: Tensor  # (H, hd) the query (after RoPE)
    K: Tensor  # (H, t+1, hd)
    V: Tensor  # (H, t+1, hd)


def _key_matches(k: Tensor, k_rec: Tensor, rtol: float) -> bool:
    """Whether a recomputed key (or value) is the one the block itself cached."""
    return float((k - k_rec).abs().max()) <= rtol * max(float(k_rec.abs().max()), 1e-30)


def _attend(at: _Attention, a: Tensor, K_pre: Tensor, V_pre: Tensor, k_rec: Tensor,
            bias: Tensor | None, rtol: float) -> _Attended | None:
    """The attention branch of the query token t at the normed input ``a`` (d,); None where
    the recomputed key of t is not the one the block cached."""
    H, Hkv, hd = at.H, at.Hkv, at.hd
    rep = H // Hkv

    def proj(W: Tensor, b: Tensor | None) -> Tensor:
        return W @ a + (b if b is not None else 0)

    q, k, v = proj(at.Wq, at.bq).view(H, hd), proj(at.Wk, at.bk).view(Hkv, hd), proj(at.Wv, at.bv).view(Hkv, hd)
    if at.rope is not None:
        q, k = q @ at.rope.T, k @ at.rope.T
    # the recomputed key of token t must be the one the block itself cached
    if not _key_matches(k, k_rec, rtol):
        return None
    K = torch.cat([K_pre, k[:, None, :]], dim=1).repeat_interleave(rep, dim=0)  # (H, t+1, hd)
    V = torch.cat([V_pre, v[:, None, :]], dim=1).repeat_interleave(rep, dim=0)  # (H, t+1, hd)
    s = at.scale * (K @ q[:, :, None])[..., 0]  # (H, t+1)
    if bias is not None:
        s = s + bias
    p = torch.softmax(s, dim=-1)  # (H, t+1)
    o = (p[:, :, None] * V).sum(1)  # (H, hd)
    val = at.Wo @ o.reshape(-1) + (at.bo if at.bo is not None else 0)  # (d,)
    return _Attended(val, p, o, q, K, V)


def _attention_jacobian(at: _Attention, att: _Attended, J_n: NormJacobian) -> Tensor:
    """The attention branch's Jacobian (d, d) with respect to x_t (its norm J_n applied)."""
    H, Hkv, hd = at.H, at.Hkv, at.hd
    rep = H // Hkv
    p, o, q, K, V = att.p, att.o, att.q, att.K, att.V
    # Jacobians with respect to the NORMED input a; the norm's J_n multiplies the (d, d)
    # result on the right once at the end (every term is linear in it), not each W
    Jq = at.Wq.view(H, hd, -1)  # (H, hd, d)
    Jk = at.Wk.view(Hkv, hd, -1)  # (Hkv, hd, d)
    Jv = at.Wv.view(Hkv, hd, -1)  # (Hkv, hd, d)
    if at.rope is not None:
        Jq, Jk = at.rope @ Jq, at.rope @ Jk
    Pm = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # (H, t+1, t+1)
    C = at.scale * V.mT @ Pm @ K  # (H, hd, hd)
    pt = p[:, -1]  # (H,)
    ck = at.scale * pt[:, None] * (V[:, -1] - o)  # (H, hd)
    # grouped-query attention: each kv head g serves the query heads g*rep..g*rep+rep-1 (W_k
    # repeated as the einsum over heads needs it; W_v broadcast over them, not repeated)
    qJk = torch.einsum("hi,hid->hd", q, Jk.repeat_interleave(rep, dim=0) if rep > 1 else Jk)
    Jo = torch.baddbmm(ck[:, :, None] * qJk[:, None, :], C, Jq)  # (H, hd, d)
    Jo.view(Hkv, rep, hd, -1).add_(pt.view(Hkv, rep, 1, 1) * Jv[:, None])
    return J_n.right_of(at.Wo @ Jo.reshape(H * hd, -1))  # (d, d)


def _rope_matrix(block: nn.Module, cos: Tensor, sin: Tensor, hd: int) -> Tensor | None:
    """The rotary map at one position as a matrix (hd, hd), from the model's own function."""
    mod = sys.modules.get(type(block).__module__)
    fn = getattr(mod, "apply_rotary_pos_emb", None)
    if fn is None:
        return None
    E = torch.eye(hd, dtype=cos.dtype, device=cos.device)[None, None]  # (1, 1, hd, hd)
    qr, _ = fn(E, E, cos.reshape(1, 1, hd), sin.reshape(1, 1, hd))  # rows: R e_i
    return qr[0, 0].T.contiguous()


def _rope_at(block: nn.Module, row_kwargs: dict[str, Any], hd: int,
             dtype: torch.dtype) -> Tensor | None:
    """The rotary map (hd, hd) at the position of a one-row call (its ``position_embeddings``),
    or None where the call has none of the expected shape."""
    pe = row_kwargs.get("position_embeddings")
    if not (isinstance(pe, tuple) and len(pe) == 2) or pe[0].numel() != hd:
        return None
    return _rope_matrix(block, pe[0].to(dtype), pe[1].to(dtype), hd)


def _linear(m: HFModule, transpose: bool = False) -> tuple[Tensor, Tensor | None]:
    W = m.weight.T if transpose else m.weight  # Conv1D stores (in, out)
    return W, getattr(m, "bias", None)


# ----------------------------------------------------------------------------- blocks
def _gpt2(block: HFModule, x: Tensor) -> tuple[Any, ...] | None:
    at = block.attn
    if getattr(at, "is_cross_attention", False) or type(block.mlp.c_fc).__name__ != "Conv1D":
        return None
    W, b = _linear(at.c_attn, transpose=True)  # (3d, d)
    d = x.shape[0]
    H, hd = int(at.num_heads), int(at.head_dim)
    bq, bk, bv = (None, None, None) if b is None else b.split(d)
    Wo, bo = _linear(at.c_proj, transpose=True)
    Wq, Wk, Wv = W.split(d)
    attn = _Attention(Wq, Wk, Wv, bq, bk, bv, Wo, bo, H, H, hd, _gpt2_scaling(at, hd), None)
    W_in, b_in = _linear(block.mlp.c_fc, transpose=True)
    W_out, b_out = _linear(block.mlp.c_proj, transpose=True)
    mlp = ("plain", W_in, b_in, W_out, b_out, block.mlp.act)
    return block.ln_1, attn, block.ln_2, mlp


def _gpt2_scaling(at: HFModule, hd: int) -> float:
    """GPT-2's attention score scale: ``at.scaling`` (transformers 4.54+), else from the flags
    the older attention reads at every call (1/sqrt(head_dim), then 1/(layer_idx + 1))."""
    if getattr(at, "scaling", None) is not None:
        return float(at.scaling)
    scale = float(hd) ** -0.5 if at.scale_attn_weights else 1.0
    if getattr(at, "scale_attn_by_inverse_layer_idx", False):
        scale /= float(at.layer_idx + 1)
    return scale


def _llama(block: HFModule, x: Tensor, row_kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    sa = block.self_attn
    cfg = sa.config
    H, Hkv, hd = int(cfg.num_attention_heads), int(cfg.num_key_value_heads), int(sa.head_dim)
    R = _rope_at(block, row_kwargs, hd, x.dtype)
    if R is None:
        return None
    Wq, bq = _linear(sa.q_proj)
    Wk, bk = _linear(sa.k_proj)
    Wv, bv = _linear(sa.v_proj)
    Wo, bo = _linear(sa.o_proj)
    attn = _Attention(Wq, Wk, Wv, bq, bk, bv, Wo, bo, H, Hkv, hd, float(sa.scaling), R)
    m = block.mlp
    mlp = ("gated", *_linear(m.gate_proj), *_linear(m.up_proj), *_linear(m.down_proj), m.act_fn)
    return block.input_layernorm, attn, block.post_attention_layernorm, mlp


def _transformer_lens(block: HFModule, x: Tensor) -> tuple[Any, ...] | None:
    """TransformerLens 3's ``TransformerBlock``: pre-norm, a plain ``Attention`` with learned
    or no positions in the block (rotary keys are cached before their rotation there, so not
    here: the decode step's pullback takes those), an elementwise ``MLP``; anything else None
    (and whatever this does not see is caught by the output check and the verification)."""
    cfg = block.cfg
    if (type(block.attn).__name__ != "Attention" or type(block.mlp).__name__ != "MLP"
            or str(cfg.positional_embedding_type) != "standard"
            or any(bool(getattr(cfg, flag, False)) for flag in (
                "use_attn_in", "use_split_qkv_input", "parallel_attn_mlp", "attn_only",
                "use_normalization_before_and_after", "use_logn_attn", "use_attention_sinks"))
            or cfg.is_layer_norm_activation() or getattr(cfg, "clip_qkv", None) is not None
            or (getattr(cfg, "attn_scores_soft_cap", -1.0) or -1.0) > 0):
        return None
    at = block.attn
    H, hd = int(at.W_Q.shape[0]), int(at.W_Q.shape[2])
    d = x.shape[0]

    def rows(W: Tensor) -> Tensor:  # (H, d, hd) -> (H*hd, d): rows = outputs
        return W.permute(0, 2, 1).reshape(-1, d)

    attn = _Attention(rows(at.W_Q), rows(at.W_K), rows(at.W_V), at.b_Q.reshape(-1),
                      at.b_K.reshape(-1), at.b_V.reshape(-1), at.W_O.reshape(H * hd, d).T,
                      at.b_O, H, H, hd, 1.0 / float(at.attn_scale), None)
    m = block.mlp
    mlp = ("plain", m.W_in.T, m.b_in, m.W_out.T, m.b_out, m.act_fn)
    return block.ln1, attn, block.ln2, mlp


def _through_width(W_out: Tensor, rows: Callable[[slice], Tensor]) -> Tensor:
    """``W_out M`` (d, d) for W_out (d, I) and M (I, d) given by row blocks ``rows(c)``
    (len(c), d), accumulated over blocks of d rows: the same flops as one GEMM, and no
    temporary larger than a (d, d) block (an (I, d) one is 3-4 Jacobians' worth)."""
    d, width = W_out.shape
    out = torch.zeros(d, rows(slice(0, 0)).shape[1], dtype=W_out.dtype, device=W_out.device)
    for s in range(0, width, d):
        c = slice(s, min(s + d, width))
        out.addmm_(W_out[:, c], rows(c))
    return out


def _mlp(mlp: tuple[Any, ...], a: Tensor, J_n: NormJacobian) -> tuple[Tensor, Tensor]:
    """MLP value (d,) and Jacobian N (d, d) at the normed input ``a``."""
    if mlp[0] == "plain":
        _, W_in, b_in, W_out, b_out, act = mlp
        z = W_in @ a + (b_in if b_in is not None else 0)  # (I,)
        h, dh = _act_and_grad(act, z)
        val = W_out @ h + (b_out if b_out is not None else 0)
        # (W_out diag(act') W_in) J_n
        return val, J_n.right_of(_through_width(W_out, lambda c: dh[c, None] * W_in[c]))
    _, Wg, bg, Wu, bu, Wd, bd, act = mlp
    g = Wg @ a + (bg if bg is not None else 0)
    u = Wu @ a + (bu if bu is not None else 0)
    h, dh = _act_and_grad(act, g)
    val = Wd @ (h * u) + (bd if bd is not None else 0)
    gu = dh * u  # (I,)
    inner = lambda c: gu[c, None] * Wg[c] + h[c, None] * Wu[c]  # noqa: E731  rows c of (I, d)
    return val, J_n.right_of(_through_width(Wd, inner))  # (d, d), J_n applied once


@dataclass
class OutputStep:
    """The decode step of a known block at output token t: what its Jacobians ``J_{s t}``
    share (the block output at t reproduced the recorded one).

    ``diagonal()`` is ``J_tt`` (the decode step's own Jacobian); ``cross(s, ...)`` is
    ``J_{s t}`` for an earlier token s < t, through the key and value of s alone::

        J_{s t} = J_nf (I + N) W_o M_s J_n1(x_s),   per head h (kv head g):
        M_s,h  = p_{h s} W_v,g + c_h (q_h^T R_s W_k,g),   c_h = scale p_{h s} (v_{g s} - o_h)

    (``N`` the MLP branch's Jacobian at t, ``J_nf`` the folded final norm's, ``R_s`` the
    rotary map at s). ``A = J_nf (I + N) W_o`` is built once per output token (2 d^3 flops);
    each ``J_{s t}`` then costs one (d, H hd) x (H_kv hd, d) GEMM plus a rank-H update.
    """

    block: HFModule
    norm1: HFModule
    attn: _Attention
    att: _Attended
    J_n1: NormJacobian  # the first norm at x_t
    N: Tensor  # (d, d) MLP branch Jacobian with respect to h_t (its norm applied)
    J_nf: NormJacobian | None  # the folded final norm at y_t
    rtol: float
    _A: Tensor | None = None

    def diagonal(self) -> Tensor:
        """``J_tt`` (d, d) of the residual branch: ``J_nf (I + N)(I + J_a) - I``."""
        N, J_a = self.N, _attention_jacobian(self.attn, self.att, self.J_n1)
        J_y = torch.addmm(N, N, J_a).add_(J_a)  # (d, d): N + N J_a + J_a, without the identity
        if self.J_nf is not None:
            J_y.diagonal().add_(1.0)
            J_y = self.J_nf.left_of(J_y)  # J_nf (I + J_y)
            J_y.diagonal().sub_(1.0)
        return J_y

    def _through_output(self) -> Tensor:
        """``A = J_nf (I + N) W_o`` (d, H hd), built once."""
        if self._A is None:
            Wo = self.attn.Wo
            A = torch.addmm(Wo, self.N, Wo)
            self._A = self.J_nf.left_of(A) if self.J_nf is not None else A
        return self._A

    def cross(self, x_s: Tensor, s: int, k_rec: Tensor, v_rec: Tensor,
              row_kwargs_s: dict[str, Any]) -> Tensor | None:
        """``J_{s t}`` (d, d) for s < t: x_s (d,) the block input at s, k_rec / v_rec (Hkv, hd)
        the key and value the block cached at s, row_kwargs_s its call sliced to row s (for
        the rotary map). None where the recomputed key or value of s is not the cached one."""
        at, att = self.attn, self.att
        H, Hkv, hd = at.H, at.Hkv, at.hd
        rep = H // Hkv
        n1 = norm_jacobian(self.norm1, x_s)
        if n1 is None:
            return None
        a_s, J_n = n1
        k = (at.Wk @ a_s + (at.bk if at.bk is not None else 0)).view(Hkv, hd)
        v = (at.Wv @ a_s + (at.bv if at.bv is not None else 0)).view(Hkv, hd)
        Jk = at.Wk.view(Hkv, hd, -1)  # (Hkv, hd, d)
        if at.rope is not None:
            R = _rope_at(self.block, row_kwargs_s, hd, x_s.dtype)
            if R is None:
                return None
            k, Jk = k @ R.T, R @ Jk
        if not (_key_matches(k, k_rec, self.rtol) and _key_matches(v, v_rec, self.rtol)):
            return None
        A = self._through_output()  # (d, H hd)
        d = A.shape[0]
        p_s = att.p[:, s]  # (H,)
        # value path: sum_h p_hs A_h W_v,g(h) = sum_g (sum_{h in g} p_hs A_h) W_v,g
        B = (A.view(d, Hkv, rep, hd) * p_s.view(1, Hkv, rep, 1)).sum(2)  # (d, Hkv, hd)
        J = B.reshape(d, Hkv * hd) @ at.Wv  # (d, d)
        # key path: rank H, (A_h c_h) (q_h^T R_s W_k,g(h))
        c = at.scale * p_s[:, None] * (att.V[:, s] - att.o)  # (H, hd)
        Ac = torch.einsum("dhi,hi->dh", A.view(d, H, hd), c)  # (d, H)
        qJk = torch.einsum("gri,gid->grd", att.q.view(Hkv, rep, hd), Jk).reshape(H, -1)  # (H, d)
        return J_n.right_of(J.addmm_(Ac, qJk))


@torch.no_grad()
def output_step(block: nn.Module, final_norm: nn.Module | None, x: Tensor, keys: Tensor,
                values: Tensor, t: int, row_kwargs: dict[str, Any], recorded: Tensor,
                rtol: float) -> OutputStep | None:
    """The decode step at token t of a block `supports` knows, or None if not supported.

    block/final_norm: the analysed (dtype) copies; x (d,) = x_t; keys/values (1, Hkv, n, hd)
    as the block cached them (after RoPE); row_kwargs: the block's call sliced to row t;
    recorded (d,): the recorded block output at t (before a folded final norm), which the
    structured forward must reproduce within ``rtol`` (relative, max-norm).
    """
    name = type(block).__name__
    if name == "GPT2Block":
        parts = _gpt2(block, x)
    elif name in _LLAMA_LIKE:
        parts = _llama(block, x, row_kwargs)
    elif supports(block):  # TransformerLens 3
        parts = _transformer_lens(block, x)
    else:
        return None
    if parts is None:
        return None
    norm1, attn, norm2, mlp = parts
    bias = _bias(row_kwargs.get("attention_mask"), t, x.dtype)
    if bias is False or keys.ndim != 4 or keys.shape[0] != 1 or keys.shape[1] != attn.Hkv:
        return None
    n1 = norm_jacobian(norm1, x)
    if n1 is None:
        return None
    a1, J_n1 = n1
    att = _attend(attn, a1, keys[0, :, :t], values[0, :, :t], keys[0, :, t], bias, rtol)
    if att is None:
        return None
    h = x + att.val
    n2 = norm_jacobian(norm2, h)
    if n2 is None:
        return None
    a2, J_n2 = n2
    m_val, N = _mlp(mlp, a2, J_n2)
    y = h + m_val  # the block output at t: must be the recorded one
    scale = max(float(recorded.abs().max()), 1e-30)
    if not float((y - recorded).abs().max()) <= rtol * scale:
        return None
    J_nf = None
    if final_norm is not None:
        nf = norm_jacobian(final_norm, y)
        if nf is None:
            return None
        J_nf = nf[1]
    return OutputStep(block, norm1, attn, att, J_n1, N, J_nf, rtol)


@torch.no_grad()
def decode_step_jacobian(block: nn.Module, final_norm: nn.Module | None, x: Tensor,
                         keys: Tensor, values: Tensor, t: int, row_kwargs: dict[str, Any],
                         recorded: Tensor, rtol: float) -> Tensor | None:
    """Dense ``J^l_tt`` (d, d) of the decode step at token t, or None if not supported
    (the arguments as `output_step`'s)."""
    step = output_step(block, final_norm, x, keys, values, t, row_kwargs, recorded, rtol)
    return None if step is None else step.diagonal()
