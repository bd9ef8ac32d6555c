"""Fast path for ``J^l_tt`` of causal decoders: the block as one *decode step* at token t.

For a causal block, the output at token t depends on ``x_t`` and on the keys and values of
tokens ``0..t-1``; with every other token's hidden state fixed (DEFINITIONS.md "Block
Jacobians"), those keys and values are constants. So

    g(x_t) = F^l(x_0, ..., x_{t-1}, x_t)_t - x_t          (d,) -> (d,)

has Jacobian exactly ``J^l_tt``, and it is one query row through attention over t+1 keys plus
one row through the MLP. `TokenBranch` evaluates ``g`` on a batch ``X (m, d)`` of m
independent candidate values of ``x_t`` at once: tangents / cotangents become the batch
dimension of batched GEMMs (no work on the other n-1 rows).

Mechanism (generic over HuggingFace decoders; the transformers versions it is checked on are
in docs/families.md): every supported decoder layer calls ``cache.update(key, value,
layer_idx, ...)`` on the cache it is given and attends over what ``update`` returns. The cache
argument is recognised by what it is, not by its name (transformers has spelled it
``layer_past``, ``past_key_value``, ``past_key_values`` and ``cache``): the parameters
annotated with transformers' ``Cache`` first, then the known spellings, each *probed* by the
recording pass below; the first one whose cache receives exactly one ``update`` is used.
TransformerLens 3's blocks take a cache *entry* (``past_kv_cache_entry``: ``append`` instead
of ``update``, sequence on axis 1); the caches below speak both. Wrapped models: the block is
replayed without a TransformerLens 4 bridge's envelopes (`wrappers.without_bridges`, checked
against the recorded output), and nnsight's forward controllers are called as the modules'
own forwards (`wrappers.forward_signature`).

1. The block is run once on the whole prompt with a *recording* cache whose ``update``
   stores the prompt's keys and values and returns them unchanged (and the output is checked
   against the recorded one).
2. ``g`` calls the block on ``(m, 1, d)`` with a stateless *prefix* cache whose ``update``
   returns ``cat(prefix_kv.expand(m, ...), new_kv)`` along the sequence axis, and with the
   recorded call sliced to row t: ``attention_mask[..., t:t+1, :t+1]``, ``position_ids[...,
   t:t+1]``, ``cache_position[t:t+1]``, ``position_embeddings[..., t:t+1, :]``.
3. At build time ``J_fast v`` and ``J_fast^T u`` are compared with the generic path
   (`blockcoupling.engine.jacobian.jacobian_operator` on the residual branch of the same
   dtype copy of the block, `blockcoupling.engine.capture.replay_branch`, checked as
   `residual_branch` checks it) for random v, u; on any mismatch or failure the builder
   returns ``None`` and the caller uses the generic path.

Dense ``J^l_tt``: for block types `blockcoupling.engine.structured` knows (GPT-2,
Llama) it is assembled from the block's weights by a few GEMMs (about half the flops of the
pullback, with no autodiff); otherwise, or if the structured forward does not reproduce the
recorded output, by pulling the d identity cotangents back through ``g``. The structured
Jacobian is checked with the rest at build time; where it disagrees it is switched off for
that block (a warning says so) and the pullback is used.

Cross-token blocks ``J^l_{s t}`` (s < t: ``fixed_output``, ``fixed_input``, the influence):
`token_jacobians` takes them, and the layer's ``J_tt``, from the same recording pass and
one structured decode step per output token t (``structured.OutputStep``): x_s reaches the
output at t only through the key and value of s. Checked on the first prompt of each layer
against the generic path's products; the generic VJP / JVP batches otherwise.

Unsupported (``None``, with the reason given to ``on_fallback`` or warned): encoders
(non-causal, no reason: nothing is tried), blocks without a key-value cache argument, recorded
calls with other sequence-shaped tensors (e.g. Falcon's ALiBi), or anything the verification
rejects. `blockcoupling.engine.fastrecord` keeps the per-layer record of a run.
"""

from __future__ import annotations

import inspect
import logging
import math
import typing
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import jvp, vjp, vmap

from blockcoupling.engine import structured
from blockcoupling.engine.blocks import get_blocks
from blockcoupling.engine.capture import (
    CACHE_NAMES,
    BlockReplay,
    Capture,
    check_call_index,
    check_replay,
    first_output,
    prepare_replay,
    relative_error,
    replay_branch,
    replay_context,
    replay_tolerance,
)
from blockcoupling.engine.fastrecord import FastPathWarning
from blockcoupling.engine.jacobian import (
    DEFAULT_MEMORY_BYTES,
    as_columns,
    check_finite,
    check_positions,
    jacobian_operator,
    vectors_in_budget,
)
from blockcoupling.engine.wrappers import forward_signature, original_module
from blockcoupling.errors import BlockCouplingError

__all__ = [
    "VERIFY_RTOL",
    "TokenBranch",
    "token_jacobians",
    "token_branch",
    "token_branches",
]

#: Relative tolerance of the build-time check ``J_fast v == J_generic v`` by analysis dtype.
#: float64 is 1e-6, not 1e-12: Llama-family RMSNorms compute in float32 internally.
VERIFY_RTOL: dict[torch.dtype, float] = {
    torch.float64: 1e-6,
    torch.float32: 1e-4,
    torch.float16: 5e-2,
    torch.bfloat16: 5e-2,
}

_LOG = logging.getLogger(__name__)

# Rough number of d-sized (and intermediate-sized) activations kept per batch row.
_ROW_FACTOR: int = 48
_PARAM_FACTOR: int = 32
# Blocks (the model's own modules) whose structured Jacobian failed the build-time check:
# the pullback is used for them from then on, also in unverified builds of later prompts.
_STRUCTURED_OFF: weakref.WeakSet[nn.Module] = weakref.WeakSet()


# ----------------------------------------------------------------------------- caches
def _cache_base() -> type:
    try:
        from transformers.cache_utils import Cache
    except ImportError:  # pragma: no cover - transformers is a dependency of the fast path
        return object
    return Cache


def _init_cache(cache: Any) -> None:
    """``Cache.__init__``: with an empty layer list (transformers 4.56+) or no argument."""
    try:
        super(type(cache), cache).__init__(layers=[])
    except TypeError:  # transformers < 4.56: Cache() takes no layers
        super(type(cache), cache).__init__()


# Two cache protocols reach a block: transformers' ``Cache.update(key, value, layer_idx)``
# with tensors (batch, heads, seq, hd), and TransformerLens 3's cache entry (its blocks'
# ``past_kv_cache_entry``): ``past_keys.size(1)`` is the cached length and ``append(key,
# value)`` returns the whole sequence, tensors (batch, seq, heads, hd). Both caches below
# speak both; what they keep is in transformers' layout.
class _RecordingCache(_cache_base()):  # type: ignore[misc]
    """Stores the keys/values of the one ``update`` (or ``append``) call and returns them
    unchanged."""

    def __init__(self) -> None:
        _init_cache(self)
        self.records: list[tuple[Tensor, Tensor]] = []
        self.past_keys = self.past_values = torch.empty(1, 0)  # nothing cached before

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int = 0,
               *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self.records.append((key_states.detach(), value_states.detach()))
        return key_states, value_states

    def append(self, new_keys: Tensor, new_values: Tensor) -> tuple[Tensor, Tensor]:
        """TransformerLens 3: (batch, seq, heads, hd), kept as (batch, heads, seq, hd)."""
        self.records.append((new_keys.detach().transpose(1, 2),
                             new_values.detach().transpose(1, 2)))
        return new_keys, new_values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class _PrefixCache(_cache_base()):  # type: ignore[misc]
    """Stateless: ``update(k, v)`` -> ``(cat(K_pre, k), cat(V_pre, v))`` on the sequence axis
    (``append`` likewise, in TransformerLens 3's layout).

    ``K_pre``/``V_pre`` (1, ..., t, hd) are expanded to the batch size of ``k`` (m rows).
    """

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        _init_cache(self)
        self.keys = keys  # (1, H_kv, t, hd)
        self.values = values  # (1, H_kv, t, hd)

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int = 0,
               *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        m = key_states.shape[0]
        k = self.keys.expand(m, *self.keys.shape[1:])
        v = self.values.expand(m, *self.values.shape[1:])
        return torch.cat([k, key_states], dim=-2), torch.cat([v, value_states], dim=-2)

    @property
    def past_keys(self) -> Tensor:  # TransformerLens 3: (1, t, H_kv, hd)
        return self.keys.transpose(1, 2)

    @property
    def past_values(self) -> Tensor:
        return self.values.transpose(1, 2)

    def append(self, new_keys: Tensor, new_values: Tensor) -> tuple[Tensor, Tensor]:
        m = new_keys.shape[0]
        k = self.past_keys.expand(m, *self.past_keys.shape[1:])
        v = self.past_values.expand(m, *self.past_values.shape[1:])
        return torch.cat([k, new_keys], dim=1), torch.cat([v, new_values], dim=1)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.keys.shape[-2])


# ----------------------------------------------------------------------------- slicing
def _slice_kwarg(name: str, value: Any, t: int, n: int) -> Any:
    """Row-t version of one recorded keyword argument; raises ValueError if unknown."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if name == "attention_mask" and isinstance(value, Tensor):
        if value.ndim == 4 and value.shape[-2] == n and value.shape[-1] >= n:
            return value[..., t : t + 1, : t + 1]  # (b, 1, 1, t+1)
        if value.ndim == 2 and value.shape[-1] == n:
            return value[:, : t + 1]
        raise ValueError(f"attention_mask of shape {tuple(value.shape)}")
    if name in ("position_ids", "cache_position") and isinstance(value, Tensor):
        if value.shape[-1] != n:
            raise ValueError(f"{name} of shape {tuple(value.shape)}")
        return value[..., t : t + 1]
    # rotary (cos, sin); Gemma 3 before transformers 5 passes a global and a local pair
    if name.startswith("position_embeddings") and isinstance(value, tuple):
        out = []
        for v in value:
            if not (isinstance(v, Tensor) and v.ndim >= 2 and v.shape[-2] == n):
                raise ValueError("position_embeddings of unexpected shape")
            out.append(v[..., t : t + 1, :])
        return tuple(out)
    if isinstance(value, Tensor) and n in tuple(value.shape):
        raise ValueError(f"sequence-shaped argument {name!r} of shape {tuple(value.shape)}")
    if isinstance(value, (tuple, list, dict)):
        raise ValueError(f"structured argument {name!r}")
    return value


def _failed(what: str, err: BaseException) -> str:
    """Why a step of the fast path failed, in words: what was tried and the kind of error
    (the exception's own text, which names library internals, goes to the debug log)."""
    _LOG.debug("fast path: %s failed", what, exc_info=err)
    kinds = {TypeError: "it does not accept those arguments",
             ValueError: "a value of unexpected shape or content",
             RuntimeError: "a tensor operation failed",
             AttributeError: "a part the fast path reads is missing",
             IndexError: "a position out of range"}
    why = next((text for kind, text in kinds.items() if isinstance(err, kind)), "an error")
    return f"{what} failed: {why}"


class _Refused(Exception):
    """The fast path does not apply to this block's call (the message says why)."""


def _mentions_cache(annotation: Any) -> bool:
    """Whether a parameter annotation names transformers' ``Cache`` (or a subclass), in any
    union or container, as an object or as a string (``from __future__ import annotations``)."""
    if annotation is inspect.Parameter.empty or annotation is None:
        return False
    if isinstance(annotation, str):
        return "Cache" in annotation
    base = _cache_base()
    if isinstance(annotation, type):
        return base is not object and issubclass(annotation, base)
    return any(_mentions_cache(a) for a in typing.get_args(annotation))


def _annotation_text(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else str(annotation).replace("typing.", "")


def _named_call(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> tuple[dict[str, Any], str, list[str]]:
    """All arguments by name, the hidden-state name and the candidate cache parameters: those
    annotated ``Cache`` first, then the known spellings the forward takes (by name, or through
    ``**kwargs`` where the recorded call passed it)."""
    sig = forward_signature(block)
    bound = sig.bind(*args, **kwargs)
    named: dict[str, Any] = {}
    for pname, val in bound.arguments.items():
        kind = sig.parameters[pname].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.update(val)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if val:
                raise _Refused("block called with extra positional arguments")
        else:
            named[pname] = val
    params = [p for p in sig.parameters.values()
              if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if not params:
        raise _Refused("block.forward has no hidden-state parameter")
    hidden_name = params[0].name
    annotated = [p.name for p in sig.parameters.values()
                 if p.name != hidden_name and _mentions_cache(p.annotation)]
    known = [c for c in CACHE_NAMES if c in sig.parameters or c in named]
    candidates = list(dict.fromkeys(annotated + known))
    if not candidates:
        raise _Refused("block.forward takes no key-value cache (no parameter annotated Cache, "
                       f"none named {', '.join(CACHE_NAMES)})")
    return named, hidden_name, candidates


def _record(block: nn.Module, named: dict[str, Any], hidden_name: str, candidates: list[str],
            x: Tensor) -> tuple[str, Tensor, Tensor, Tensor]:
    """The recording pass over the whole prompt, probing each candidate cache parameter: the
    first whose cache gets exactly one ``update`` -> (its name, block output (1, n, d), keys,
    values). Raises `_Refused` naming what each candidate did."""
    tried: list[str] = []
    for name in candidates:
        rec = _RecordingCache()
        full = {**named, hidden_name: x[None], name: rec}
        try:
            with replay_context(), torch.no_grad():
                out = first_output(block(**full))  # (1, n, d)
        except (TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
            tried.append(f"{name}: {_failed('calling the block with a cache there', err)}")
            continue
        if len(rec.records) == 1:
            return name, out, *rec.records[0]
        tried.append(f"{name}: the cache got {len(rec.records)} updates, not 1")
    sig = forward_signature(block)
    tuples = [c for c in candidates if c in sig.parameters
              and "tuple" in _annotation_text(sig.parameters[c].annotation).lower()]
    what = (f"a tuple key-value cache ({tuples[0]}: "
            f"{_annotation_text(sig.parameters[tuples[0]].annotation)}), not a transformers "
            "Cache" if tuples else "no argument takes a key-value cache")
    raise _Refused(what + " (" + "; ".join(tried) + ")")


# ----------------------------------------------------------------------------- operator
@dataclass
class TokenBranch:
    """``J^l_tt`` of one causal block at one token, through the decode-step map ``g``.

    ``g(X)`` (m, d) -> (m, d): the residual-branch output at token t for m candidate values of
    ``x_t`` (rows independent). ``x`` (d,) is the recorded ``x^{l-1}_t``. Satisfies the
    `blockcoupling.engine.svd.LinearOperator` protocol (``d``, ``dtype``, ``device``,
    ``matmat``, ``rmatmat``), so `blockcoupling.engine.svd.randomized_topk_svd` takes it.
    """

    g: Callable[[Tensor], Tensor]
    x: Tensor  # (d,)
    layer: int
    token: int
    chunk_size: int
    verify_error: float | None = None  # relative error of the build-time check
    # dense J (d, d) from the block's structure (engine.structured), None if not applicable
    dense_fn: Callable[[], Tensor | None] | None = None
    d: int = field(init=False)
    dtype: torch.dtype = field(init=False)
    device: torch.device = field(init=False)

    def __post_init__(self) -> None:
        self.d = int(self.x.shape[0])
        self.dtype = self.x.dtype
        self.device = self.x.device
        self._dense: Tensor | None = None

    @property
    def structured(self) -> bool:
        """Whether `jacobian` assembles J from the block's structure."""
        return self.dense_fn is not None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.d, self.d)

    def _check(self, M: Tensor, name: str) -> Tensor:
        return as_columns(M, self.d, self.device, self.dtype, name)

    def value(self) -> Tensor:
        """``g(x)`` (d,): the residual branch at token t (equals the recorded F(x)_t - x_t)."""
        with replay_context(), torch.no_grad():
            return self.g(self.x[None])[0]

    def matmat(self, V: Tensor) -> Tensor:
        """(d, m) -> (d, m) = J V: forward mode, the primal computed once (unbatched) and only
        the m tangents batched by ``vmap``."""
        V = self._check(V, "V")
        x1 = self.x[None]  # (1, d)
        push = vmap(lambda v: jvp(self.g, (x1,), (v[None],))[1][0])
        outs: list[Tensor] = []
        with replay_context(), torch.no_grad():
            for s in range(0, V.shape[1], self.chunk_size):
                outs.append(push(V[:, s : s + self.chunk_size].T))  # (c, d)
        return check_finite(torch.cat(outs).T, "Jacobian-vector product")  # (d, m)

    def rmatmat(self, U: Tensor) -> Tensor:
        """(d, m) -> (d, m) = J^T U: one forward pass of the single row, then the m
        cotangents pulled back together (``vmap`` over the vjp function)."""
        U = self._check(U, "U")
        outs: list[Tensor] = []
        with replay_context():
            vjp_fn = vjp(self.g, self.x[None])[1]  # forward once, batch 1: (g(x), pullback)
            pull = vmap(lambda u: vjp_fn(u[None])[0][0])
            for s in range(0, U.shape[1], self.chunk_size):
                outs.append(pull(U[:, s : s + self.chunk_size].T).detach())  # (c, d): J^T u_i
        return check_finite(torch.cat(outs).T, "vector-Jacobian product")  # (d, m)

    def structured_jacobian(self) -> Tensor | None:
        """Dense ``J^l_tt`` (d, d) from the block's structure (computed once, then kept), or
        None where that does not apply (never the d pullbacks of `jacobian`)."""
        if self.dense_fn is None:
            return None
        if self._dense is None:
            J = self.dense_fn()
            if J is None:
                self.dense_fn = None
                return None
            self._dense = check_finite(J, "Jacobian")
        return self._dense

    def jacobian(self) -> Tensor:
        """Dense ``J^l_tt`` (d, d), rows = output coordinates (computed once, then kept).

        From the block's structure where `dense_fn` is set and applies; otherwise one
        forward of the single row and a backward with the identity as cotangents (chunked by
        ``chunk_size``): row i of the input gradient is ``e_i^T J``.
        """
        if self._dense is None:
            J = self.dense_fn() if self.dense_fn is not None else None
            if J is None:
                self.dense_fn = None
                eye = torch.eye(self.d, dtype=self.dtype, device=self.device)
                J = self.rmatmat(eye).T.contiguous()  # (d, d): (J^T I)^T
            self._dense = check_finite(J, "Jacobian")
        return self._dense


def _default_chunk(d: int, kv_width: int, n: int, dtype: torch.dtype,
                   memory_bytes: int = DEFAULT_MEMORY_BYTES, block_params: int = 0) -> int:
    """Vectors per batch that fit ``memory_bytes``. Per vector the decode step keeps every
    layer's activations (and tangents): counted as ``_ROW_FACTOR`` d-sized rows, or, when
    larger, ``_PARAM_FACTOR`` x (block parameters / d) elements -- calibrated on one
    Llama-3-70B-shaped block (60 vectors took 0.93 GB, BENCHMARKS.md), where the MLP is 3.5 d
    wide and d-sized rows alone undercount by ~10x."""
    itemsize = max(1, torch.finfo(dtype).bits // 8)
    rows = max(_ROW_FACTOR * d, _PARAM_FACTOR * block_params // max(d, 1))
    per_row = itemsize * (rows + 4 * kv_width * (n + 1))
    return vectors_in_budget(per_row, memory_bytes, most=d)


# ----------------------------------------------------------------------------- builders
def token_branches(
    model: nn.Module,
    cap: Capture,
    layer: int,
    prompt: int,
    tokens: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    verify: bool = True,
    n_check: int = 2,
    chunk_size: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    seed: int = 0,
    device: torch.device | str | None = None,
    verify_forward: bool = True,
    on_fallback: Callable[[str], None] | None = None,
) -> dict[int, TokenBranch] | None:
    """Decode-step operators for ``J^l_tt`` at each token in ``tokens`` (real, 0-based).

    Shares one dtype copy of the block and one recording pass between the tokens. Returns
    ``None`` when the model is not causal, the block is not supported, or (``verify=True``)
    ``J_fast`` differs from the generic path on ``n_check`` random vectors per token by more
    than `VERIFY_RTOL` (a warning says which); the caller then uses the generic path.
    ``verify_forward=False``: the caller uses only dense Jacobians, so where the structured J
    passes its check the decode step's forward-mode product is not checked (see
    `_verify`).
    Where the fast path is refused (a causal model), the reason goes to ``on_fallback``
    (``measure`` collects them into one warning per run and ``meta["fast_path"]``) or, without
    it, is warned about (`blockcoupling.engine.fastrecord.FastPathWarning`).
    Raises `BlockCouplingError` for out-of-range layer, prompt or token.
    """
    check_call_index(cap, layer, prompt)
    n_real = cap.lengths[prompt]
    toks = check_positions(tokens, n_real, f"tokens of prompt {prompt}")
    if not cap.spec.causal:
        return None

    def refuse(why: str) -> None:
        if on_fallback is not None:
            on_fallback(why)
        else:
            warnings.warn(f"fast path for layer {layer} ({cap.spec.arch}) refused ({why}); "
                          "using the generic path (slower).", FastPathWarning, stacklevel=3)

    try:
        rp, built = _build(model, cap, layer, prompt, toks, dtype, chunk_size, memory_bytes,
                           device)
    except _Refused as err:
        refuse(str(err))
        return None
    except (TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
        if isinstance(err, BlockCouplingError):
            raise
        refuse(_failed("building the decode step", err))
        return None
    if verify:
        bad_msg = _verify(model, cap, layer, prompt, rp, built, n_check, seed,
                          forward=verify_forward)
        if bad_msg is not None:
            refuse(f"disagrees with the generic Jacobian: {bad_msg}")
            return None
    return built


def token_branch(
    model: nn.Module,
    cap: Capture,
    layer: int,
    prompt: int,
    token: int,
    *,
    dtype: torch.dtype = torch.float32,
    verify: bool = True,
    chunk_size: int | None = None,
    seed: int = 0,
) -> TokenBranch | None:
    """Decode-step operator for ``J^l_{token token}`` (see `token_branches`), or None."""
    out = token_branches(model, cap, layer, prompt, [token], dtype=dtype, verify=verify,
                         chunk_size=chunk_size, seed=seed)
    return None if out is None else out[int(token)]


@dataclass
class _Recorded:
    """One block's replay of one prompt with the keys and values its cache was given."""

    rp: Any  # capture.BlockReplay: the (dtype) block, its final norm, x (n, d), recorded
    named: dict[str, Any]  # the recorded call, every argument by name
    hidden_name: str
    cache_name: str
    keys: Tensor  # (1, ..., n, hd) as the block cached them (after RoPE)
    values: Tensor

    def row_kwargs(self, t: int) -> dict[str, Any]:
        """The recorded call sliced to row t (without the hidden states and the cache)."""
        n = int(self.rp.x.shape[0])
        return {k: _slice_kwarg(k, v, t, n) for k, v in self.named.items()
                if k not in (self.hidden_name, self.cache_name)}


def _replay_recorded(model: nn.Module, cap: Capture, layer: int, prompt: int,
                     dtype: torch.dtype, device: torch.device | str | None) -> _Recorded:
    """The block's recording pass over the prompt (probing the cache argument), checked
    against the captured output; raises `_Refused` where the fast path does not apply."""
    rp = prepare_replay(model, cap, layer, prompt, dtype=dtype, device=device, original=True)
    named, hidden_name, candidates = _named_call(rp.block, rp.args, rp.kwargs)
    n = rp.x.shape[0]
    if named.get("alibi") is not None:  # Falcon ALiBi: key-length-shaped bias, not verified
        raise _Refused("ALiBi position bias (a key-length-shaped argument)")
    if named.get("encoder_hidden_states") is not None:
        raise _Refused("cross-attention to encoder states")
    cache_name, out, keys, values = _record(rp.block, named, hidden_name, candidates, rp.x)
    if keys.ndim < 3 or keys.shape[-2] != n or values.shape[-2] != n or keys.shape[0] != 1:
        raise _Refused(f"cached keys of shape {tuple(keys.shape)} for {n} tokens")
    real = slice(0, cap.lengths[prompt])
    err = relative_error(out[0], rp.recorded, real)
    if not err <= replay_tolerance(cap, dtype):
        block = get_blocks(model, cap.spec)[layer - 1]
        if original_module(block) is not block:
            raise _Refused(f"the block inside the wrapper's {type(block).__name__} computes "
                           "another output than the wrapped block did (relative error "
                           f"{err:.3g}): a hook that changes activations is on it")
        raise _Refused(f"the recording pass differs from the captured output (relative "
                       f"error {err:.3g})")
    return _Recorded(rp, named, hidden_name, cache_name, keys, values)


def token_jacobians(
    model: nn.Module,
    cap: Capture,
    layer: int,
    prompt: int,
    keys: Sequence[tuple[int, int]],
    *,
    dtype: torch.dtype = torch.float32,
    verify: bool = True,
    n_check: int = 2,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> dict[tuple[int, int], Tensor] | None:
    """Dense ``J^l_{s t}`` (d, d) for the ``keys`` (s, t), s <= t, of a causal block whose
    structure `blockcoupling.engine.structured` knows: one decode step per output token
    t (`structured.output_step`; ``J_tt`` is its own Jacobian), then a GEMM per earlier
    s (``OutputStep.cross``), instead of d pullbacks (or pushforwards) through the whole
    prompt. For the token-wise kinds with cross-token pairs (``fixed_output``,
    ``fixed_input``) and the influence; the diagonal alone (``depth``, ``self``) goes through
    `token_branches`, whose decode-step operator also serves matrix-free products.

    ``None`` where that does not apply (an encoder, another block type, a key with s > t,
    a block whose structured Jacobian failed its check before, a structured forward that does
    not reproduce the recorded outputs); the caller then uses the generic path. With
    ``verify`` the Jacobians are compared with the generic path on ``n_check`` random vectors
    (`_verify_cross`); on a mismatch a warning says so, the block's structured route is
    switched off and ``None`` is returned.
    """
    check_call_index(cap, layer, prompt)
    pairs = [(int(s), int(t)) for s, t in keys]
    n_real = cap.lengths[prompt]
    check_positions([v for st in pairs for v in st], n_real, f"tokens of prompt {prompt}")
    if not (cap.spec.causal and pairs) or any(s > t for s, t in pairs):
        return None
    block_ref = get_blocks(model, cap.spec)[layer - 1]
    if not structured.supports(original_module(block_ref)) or block_ref in _STRUCTURED_OFF:
        return None
    try:
        got = _replay_recorded(model, cap, layer, prompt, dtype, device)
        out = _cross_from(got, pairs, replay_tolerance(cap, dtype))
    except _Refused:  # the decode step itself does not apply: token_branches says why
        return None
    except (TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
        if isinstance(err, BlockCouplingError):
            raise
        warnings.warn(f"structured token Jacobians of layer {layer} ({cap.spec.arch}) "
                      f"could not be built ({_failed('the structured step', err)}); using the generic "
                      "path (slower).", FastPathWarning, stacklevel=2)
        return None
    if out is None or not verify:
        return out
    bad = _verify_cross(cap, layer, prompt, got.rp, out, n_check, seed)
    if bad is not None:
        _STRUCTURED_OFF.add(block_ref)
        warnings.warn(f"structured token Jacobians of layer {layer} ({cap.spec.arch}) "
                      f"disagree with the generic path ({bad}); using the generic path.",
                      FastPathWarning, stacklevel=2)
        return None
    return out


def _cross_from(got: _Recorded, pairs: Sequence[tuple[int, int]], rtol: float
                ) -> dict[tuple[int, int], Tensor] | None:
    """``J_{s t}`` of every pair (s <= t) from one output step per distinct t; None where any
    step or Jacobian does not apply."""
    rp, keys, values = got.rp, got.keys, got.values
    by_out: dict[int, list[int]] = {}
    for s, t in pairs:
        by_out.setdefault(t, []).append(s)
    out: dict[tuple[int, int], Tensor] = {}
    with torch.no_grad():
        for t, ins in sorted(by_out.items()):
            step = structured.output_step(rp.block, rp.norm, rp.x[t], keys, values, t,
                                          got.row_kwargs(t), rp.recorded[t], rtol)
            if step is None:
                return None
            for s in ins:
                J = step.diagonal() if s == t else step.cross(
                    rp.x[s], s, keys[0, :, s], values[0, :, s], got.row_kwargs(s))
                if J is None:
                    return None
                out[(s, t)] = check_finite(J, "Jacobian")
    return out


def _verify_cross(cap: Capture, layer: int, prompt: int, rp: BlockReplay,
                  Js: dict[tuple[int, int], Tensor], n_check: int, seed: int) -> str | None:
    """None if every ``J_{s t}`` matches the generic path on ``n_check`` random vectors, else
    a description. Grouped as the generic path would compute them: per output token t one
    pullback of the vectors placed at t gives ``J_{s t}^T V`` for every s; per input token s
    one pushforward gives ``J_{s t} V`` for every t; whichever needs fewer passes (one each
    for ``fixed_output`` and ``fixed_input`` at one token). The generic path is the replay
    ``rp`` that built them (`capture.replay_branch`), checked against the recorded output."""
    f, x, _ = _checked_branch(cap, layer, prompt, rp)
    n, d = x.shape
    tol = VERIFY_RTOL.get(x.dtype, 5e-2)
    gen = torch.Generator().manual_seed(int(seed))
    by_out: dict[int, list[int]] = {}
    by_in: dict[int, list[int]] = {}
    for s, t in Js:
        by_out.setdefault(t, []).append(s)
        by_in.setdefault(s, []).append(t)
    reverse = len(by_out) <= len(by_in)
    worst = 0.0
    try:
        with replay_context(), torch.no_grad():
            vjp_fn = vjp(f, x)[1] if reverse else None
            for fixed, others in (by_out if reverse else by_in).items():
                V = torch.randn(n_check, d, generator=gen, dtype=torch.float64).to(x.device, x.dtype)
                E = torch.zeros(n_check, n, d, dtype=x.dtype, device=x.device)
                E[:, fixed] = V
                if vjp_fn is not None:  # (m, n, d): row s is J_{s t}^T v
                    ref = vmap(lambda u: vjp_fn(u)[0])(E).detach()
                else:  # (m, n, d): row t is J_{s t} v
                    ref = vmap(lambda e: jvp(f, (x,), (e,))[1])(E).detach()
                for o in others:
                    key = (o, fixed) if reverse else (fixed, o)
                    got = V @ Js[key] if reverse else V @ Js[key].T  # (m, d)
                    worst = max(worst, _rel(got, ref[:, o]))
    except (TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
        return _failed("the check's products", err)
    if not worst <= tol:  # also catches NaN
        return f"relative error {worst:.3g} > {tol:.3g}"
    return None


def _build(model: nn.Module, cap: Capture, layer: int, prompt: int, tokens: list[int],
           dtype: torch.dtype, chunk_size: int | None, memory_bytes: int,
           device: torch.device | str | None = None
           ) -> tuple[BlockReplay, dict[int, TokenBranch]]:
    """The decode-step operators of ``tokens``, and the replay (the block's dtype copy) they
    were built from, which the build-time check reuses."""
    got = _replay_recorded(model, cap, layer, prompt, dtype, device)
    rp, keys, values = got.rp, got.keys, got.values
    block, norm, x = rp.block, rp.norm, rp.x
    hidden_name, cache_name = got.hidden_name, got.cache_name
    n, d = x.shape
    kv_width = int(keys[0, ..., 0, :].numel())
    n_params = sum(p.numel() for p in block.parameters())
    chunk = chunk_size or _default_chunk(d, kv_width, n, dtype, memory_bytes, n_params)
    use_structured = (structured.supports(block)
                      and get_blocks(model, cap.spec)[layer - 1] not in _STRUCTURED_OFF)
    rtol = replay_tolerance(cap, dtype)

    out_map: dict[int, TokenBranch] = {}
    for t in tokens:
        row_kwargs = got.row_kwargs(t)
        cache = _PrefixCache(keys[..., :t, :], values[..., :t, :])
        g = _make_g(block, norm, row_kwargs, hidden_name, cache_name, cache)
        dense_fn = None
        if use_structured:
            dense_fn = _structured_fn(block, norm, x[t], keys, values, t, row_kwargs,
                                      rp.recorded[t], rtol)
        out_map[t] = TokenBranch(g=g, x=x[t].clone(), layer=layer, token=t, chunk_size=chunk,
                                 dense_fn=dense_fn)
    return rp, out_map


def _structured_fn(block: nn.Module, norm: nn.Module | None, x: Tensor, keys: Tensor,
                   values: Tensor, t: int, row_kwargs: dict[str, Any], recorded: Tensor,
                   rtol: float) -> Callable[[], Tensor | None]:
    def dense() -> Tensor | None:
        return structured.decode_step_jacobian(block, norm, x, keys, values, t, row_kwargs,
                                               recorded, rtol)

    return dense


def _make_g(block: nn.Module, norm: nn.Module | None, row_kwargs: dict[str, Any],
            hidden_name: str, cache_name: str, cache: _PrefixCache
            ) -> Callable[[Tensor], Tensor]:
    def g(X: Tensor) -> Tensor:  # (m, d) -> (m, d)
        call = {**row_kwargs, hidden_name: X[:, None, :], cache_name: cache}
        with replay_context():
            out = first_output(block(**call))  # (m, 1, d)
            if norm is not None:
                out = first_output(norm(out))
        return out[:, 0, :] - X

    return g


def _checked_branch(cap: Capture, layer: int, prompt: int, rp: BlockReplay
                    ) -> tuple[Callable[[Tensor], Tensor], Tensor, Tensor]:
    """The generic residual branch ``f`` of the replay ``rp``, its input x and ``f(x)``
    (n, d), with ``f(x) + x`` checked against the recorded output: `capture.residual_branch`
    without a second dtype copy of the block (a mismatch raises `ReplayError` as there)."""
    f = replay_branch(rp)
    with torch.no_grad():
        fx = f(rp.x)
    check_replay(cap, layer, prompt, rp, fx + rp.x)
    return f, rp.x, fx


def _verify(model: nn.Module, cap: Capture, layer: int, prompt: int, rp: BlockReplay,
            built: dict[int, TokenBranch], n_check: int, seed: int,
            forward: bool = True) -> str | None:
    """None if every token's operator matches the generic path; else a description.

    Per token, on ``n_check`` random vectors V: the decode step's value and its pullback
    ``J^T V`` against the generic path; the structured dense J (where it applies) by
    ``J^T V`` (for an explicit matrix one direction suffices: any wrong entry changes it for
    random V); and the decode step's forward-mode ``J V`` unless ``forward=False`` and the
    structured J passed (the dense J then serves every product, and forward mode through the
    decode step is never used). The generic path is the replay ``rp`` the operators were
    built from (`_checked_branch`: its ``f(x)`` is computed once for every token)."""
    f, x, fx_all = _checked_branch(cap, layer, prompt, rp)
    tol = VERIFY_RTOL.get(x.dtype, 5e-2)
    gen = torch.Generator().manual_seed(int(seed))
    for t, tb in built.items():
        try:
            op = jacobian_operator(f, x, t, t)
            V = torch.randn(tb.d, n_check, generator=gen, dtype=torch.float64).to(tb.device, tb.dtype)
            JtV = op.rmatmat(V)
            structured_ok = (tb.dense_fn is not None
                             and _verify_structured(model, cap, layer, tb, V, JtV, tol))
            errs = [_rel(tb.value(), fx_all[t]), _rel(tb.rmatmat(V), JtV)]
            if forward or not structured_ok:
                errs.append(_rel(tb.matmat(V), op.matmat(V)))
        except (TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
            return f"token {t}: {_failed('the check', err)}"
        prior = tb.verify_error if structured_ok else None
        error = max(errs + ([prior] if prior is not None else []))
        tb.verify_error = error
        if not error <= tol:  # also catches NaN
            return f"token {t}: relative error {error:.3g} > {tol:.3g}"
    return None


def _verify_structured(model: nn.Module, cap: Capture, layer: int, tb: TokenBranch, V: Tensor,
                       JtV: Tensor, tol: float) -> bool:
    """Check the structured dense J against the generic ``J^T V``: True (J kept) where it
    agrees; else switch it off for this block (with a warning) and return False."""
    try:
        J = tb.dense_fn() if tb.dense_fn is not None else None
        err = math.inf if J is None else _rel(J.T @ V, JtV)
    except (TypeError, ValueError, RuntimeError, AttributeError, IndexError) as exc:
        J, err = None, math.inf
        why = _failed("the structured Jacobian", exc)
    else:
        why = f"relative error {err:.3g} > {tol:.3g}" if J is not None else "not applicable"
    if J is not None and err <= tol:
        tb._dense = check_finite(J, "Jacobian")
        tb.verify_error = err
        return True
    tb.dense_fn = None
    if J is not None or why != "not applicable":
        _STRUCTURED_OFF.add(get_blocks(model, cap.spec)[layer - 1])
        warnings.warn(
            f"structured Jacobian of layer {layer} ({cap.spec.arch}) disagrees with the generic "
            f"path ({why}); pulling back through the decode step instead.",
            stacklevel=3,
        )
    return False


def _rel(a: Tensor, b: Tensor) -> float:
    scale = float(b.abs().max())
    err = float((a - b).abs().max())
    if not math.isfinite(err):
        return math.inf
    return err / max(scale, torch.finfo(b.dtype).tiny)
