"""One forward pass with hooks: block boundaries and each block's exact recorded call.

`capture` runs the model once (``torch.no_grad``, ``use_cache=False`` when the model's
``forward`` accepts it) and records, with forward pre-hooks (``with_kwargs=True``), the exact
arguments every block was called with, and with forward hooks its output (the first element
when the block returns a tuple). Block boundaries are the blocks' own inputs and outputs
(DEFINITIONS.md "Block boundaries"): ``boundaries[0]`` is the input of block 1 and
``boundaries[l]`` the output of block l; with ``final_norm=True`` the last boundary is taken
after the final norm. HuggingFace ``hidden_states`` are never used.

`residual_branch` turns a recorded call into a pure function of one prompt's hidden
input, ``f(X) = F^l(X) - X`` with ``X`` of shape ``(n, d)``, ready for ``torch.func``
transforms (`blockcoupling.engine.jacobian`). Key-value caches are stripped from the recorded
call (every name in ``CACHE_NAMES`` / any ``Cache`` object -> None, ``use_cache`` ->
False); the attention mask, position ids and rotary embeddings are replayed as recorded.

Attention implementation. Forward-mode AD (JVP) does not go through the fused
scaled-dot-product-attention kernels, and HuggingFace builds the attention mask for the
implementation in use at capture time. Therefore:

* ``config._attn_implementation == "sdpa"`` is kept, and every replay (``f``, hence every
  Jacobian) runs inside ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``, the composite
  implementation that supports forward and reverse AD and vmap;
* any other implementation that is not ``"eager"`` (``flash_attention_2``, ``flex_attention``,
  ...) is switched to ``"eager"`` on the user's model *before* the capture pass
  (``model.set_attn_implementation("eager")``), with a warning issued once per
  implementation (the recorded masks are eager masks). `blockcoupling.measure` puts
  the original implementation back afterwards (``engine/state.py``);
* mixture-of-experts layers run their eager loop over experts for the same reason
  (``config._experts_implementation``; transformers 5's ``grouped_mm`` has no float64 kernel
  and no vmap rule), silently: the values are the same. Also restored afterwards.

Dropout and other training-time randomness must be off. `capture` calls ``model.eval()``
with a warning when the model is in training mode; `residual_branch` raises a
[`BlockCouplingError`][blockcoupling.errors.BlockCouplingError] if the block was switched back to training
mode since.

Padding: prompts arrive right-padded with an ``attention_mask``; ``Capture.valid`` marks the
real positions and ``Capture.lengths`` their number. Left padding is refused.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from blockcoupling.engine import offload
from blockcoupling.engine.blocks import BlockSpec, get_blocks, get_module
from blockcoupling.engine.wrappers import forward_inputs, without_bridges
from blockcoupling.errors import ArchitectureError, BlockCouplingError, NumericalError, ReplayError

__all__ = [
    "BlockCall",
    "CACHE_NAMES",
    "Capture",
    "REPLAY_RTOL",
    "capture",
    "replay_context",
    "residual_branch",
]

#: the spellings of a decoder layer's key-value cache argument across transformers versions
#: (<= 4.5x ``past_key_value`` / ``layer_past``, then ``past_key_values``, 5.24 ``cache``):
#: stripped from recorded calls here; tried by the fast path after the parameters annotated
#: ``Cache`` (engine/fastpath.py)
CACHE_NAMES: tuple[str, ...] = ("cache", "past_key_values", "past_key_value", "layer_past",
                                 "past_kv_cache_entry")  # the last: TransformerLens 3's blocks
_WARNED_ATTN: set[str] = set()

#: Relative replay tolerance (max abs error / max abs recorded output, real positions) by
#: the lower of the model and analysis precisions.
REPLAY_RTOL: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 5e-2,
}


@dataclass
class BlockCall:
    """One block's recorded call: ``block(*args, **kwargs)`` with caches stripped.

    ``hidden`` says where the hidden states are: an int index into ``args`` or a kwarg name.
    ``input`` and ``output`` are the block's input and (first) output, (B, n, d), in the
    model's dtype and on the model's device.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    hidden: int | str
    input: Tensor  # (B, n, d)
    output: Tensor  # (B, n, d)


@dataclass
class Capture:
    """Result of `capture` for one batch of prompts."""

    boundaries: Tensor  # (L+1, B, n, d) float32 on CPU: x^0 .. x^L (block inputs/outputs)
    valid: Tensor  # (B, n) bool: True at real (non-padded) positions
    lengths: list[int]  # number of real tokens per prompt
    spec: BlockSpec
    final_norm: bool  # if True, boundaries[L] is after the final norm
    calls: list[BlockCall] | None = None  # per block (0-based), None if keep_calls=False
    final_output: Tensor | None = None  # (B, n, d) final-norm output, model dtype/device
    model_dtype: torch.dtype = torch.float32

    @property
    def batch_size(self) -> int:
        return int(self.boundaries.shape[1])

    @property
    def n_layers(self) -> int:
        return int(self.boundaries.shape[0]) - 1

    def device_states(self) -> list[Tensor] | None:
        """x^0 .. x^L as the forward left them, (B, n, d) each in the model's dtype on the
        model's device: the very tensors ``boundaries`` was copied from (the block calls'
        input and outputs, the final norm's output). None where the capture kept no calls
        or they lie on more than one device (a device map)."""
        if self.calls is None or (self.final_norm and self.final_output is None):
            return None
        states = [self.calls[0].input] + [c.output for c in self.calls]
        if self.final_norm:
            assert self.final_output is not None
            states[-1] = self.final_output
        return states if len({s.device for s in states}) == 1 else None


@contextlib.contextmanager
def replay_context() -> Iterator[None]:
    """Context for every replay / Jacobian call: SDPA restricted to the MATH backend."""
    with sdpa_kernel(SDPBackend.MATH):
        yield


# ----------------------------------------------------------------------------- helpers


def _accepts_kwarg(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _first_float_param(module: nn.Module) -> Tensor | None:
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            return t
    return None


def _ensure_attn_implementation(model: nn.Module) -> None:
    """Switch attention implementations other than eager / sdpa to eager (warn once)."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None) if config is not None else None
    if impl is None or impl in ("eager", "sdpa"):
        return
    if impl not in _WARNED_ATTN:
        _WARNED_ATTN.add(impl)
        warnings.warn(
            f"attention implementation {impl!r} does not support the forward-mode autodiff "
            "used for Jacobians; switching the model to 'eager' attention for the measurement "
            "(measure() restores it afterwards).",
            stacklevel=3,
        )
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter("eager")
    elif config is not None:
        config._attn_implementation = "eager"


def _ensure_experts_implementation(model: nn.Module) -> None:
    """Mixture-of-experts layers on their eager loop over experts (transformers 5's default,
    ``grouped_mm``, has no float64 kernel and no vmap rule: float64 analyses and batched
    Jacobian products would fail or crawl). The same values; restored by ``state.preserved``."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_experts_implementation", None) if config is not None else None
    if config is None or impl is None or impl == "eager":
        return
    setter = getattr(model, "set_experts_implementation", None)
    try:
        if callable(setter):
            setter("eager")
    except (ValueError, TypeError, AttributeError):  # noqa: S110 - set on the config below
        pass
    if config._experts_implementation != "eager":
        config._experts_implementation = "eager"


def _is_cache(obj: Any) -> bool:
    try:
        from transformers.cache_utils import Cache
    except ImportError:  # transformers is optional for custom models
        return False
    return isinstance(obj, Cache)


def _strip_caches(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace key-value caches by None and use_cache by False."""
    new_args = tuple(None if _is_cache(a) else a for a in args)
    new_kwargs: dict[str, Any] = {}
    for k, v in kwargs.items():
        if k in CACHE_NAMES or _is_cache(v):
            new_kwargs[k] = None
        elif k == "use_cache":
            new_kwargs[k] = False
        else:
            new_kwargs[k] = v
    return new_args, new_kwargs


def _hidden_location(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | str:
    if args and isinstance(args[0], Tensor):
        return 0
    if isinstance(kwargs.get("hidden_states"), Tensor):
        return "hidden_states"
    raise ArchitectureError(
        "A block was called without a hidden-state tensor as first argument or as "
        "'hidden_states='. Pass blocks_path= pointing to the list of transformer blocks."
    )


def first_output(output: Any) -> Tensor:
    out = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(out, Tensor):
        raise ArchitectureError(
            f"A block returned {type(out).__name__}, not a tensor (or a tuple starting with one). "
            "Pass blocks_path= pointing to the list of transformer blocks."
        )
    return out


def _map_tensors(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """Apply ``fn`` to every tensor in nested tuples / lists / dicts."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _right_padded_valid(
    inputs: Mapping[str, Tensor], batch: int, n: int
) -> tuple[Tensor, list[int]]:
    """(B, n) bool mask of real positions from the attention mask; refuse left padding."""
    mask = inputs.get("attention_mask")
    if mask is None or tuple(mask.shape) != (batch, n):
        valid = torch.ones(batch, n, dtype=torch.bool)
        return valid, [n] * batch
    valid = mask.detach().to("cpu").bool()
    lengths = valid.sum(dim=1)  # (B,)
    expected = torch.arange(n)[None, :] < lengths[:, None]  # (B, n)
    if not torch.equal(valid, expected):
        raise BlockCouplingError(
            "The attention_mask is not right-padded (real tokens first, padding last). "
            "Tokenize with tokenizer.padding_side = 'right'."
        )
    return valid, [int(x) for x in lengths]


# ----------------------------------------------------------------------------- capture


def capture(
    model: nn.Module,
    inputs: Mapping[str, Tensor],
    spec: BlockSpec,
    *,
    final_norm: bool = False,
    keep_calls: bool = True,
    boundary_dtype: torch.dtype = torch.float32,
) -> Capture:
    """Run ``model(**inputs)`` once and record block boundaries and calls.

    ``inputs`` are moved to the model's device (floating inputs such as ``pixel_values`` are
    cast to the model's dtype). Raises [`NumericalError`][blockcoupling.errors.NumericalError] if a block output is not
    finite and [`ArchitectureError`][blockcoupling.errors.ArchitectureError] if a block is not called exactly once.
    """
    _prepare(model, spec, final_norm)
    blocks = get_blocks(model, spec)
    ref = _first_float_param(model)
    model_dtype = ref.dtype if ref is not None else torch.float32
    norm = get_module(model, spec.final_norm_path) if final_norm and spec.final_norm_path else None
    raw_calls, outputs, norm_out = _record(model, blocks, norm, _call_inputs(model, inputs,
                                                                              model_dtype))
    calls = _block_calls(raw_calls, outputs, spec)
    if final_norm and len(norm_out) != 1:
        raise ArchitectureError(
            f"the final norm '{spec.final_norm_path}' was called {len(norm_out)} times "
            "(expected once). Use final_norm=False."
        )
    states = _checked_states(calls, norm_out[0] if final_norm else None)
    x0 = states[0]
    boundaries = torch.stack([s.to("cpu", boundary_dtype) for s in states])  # (L+1, B, n, d)
    B, n, d = x0.shape
    valid, lengths = _right_padded_valid(inputs, B, n)
    if spec.hidden_size != d:
        spec = dataclasses.replace(spec, hidden_size=int(d))
    return Capture(
        boundaries=boundaries,
        valid=valid,
        lengths=lengths,
        spec=spec,
        final_norm=final_norm,
        calls=calls if keep_calls else None,
        final_output=norm_out[0] if (final_norm and keep_calls) else None,
        model_dtype=model_dtype,
    )


def _prepare(model: nn.Module, spec: BlockSpec, final_norm: bool) -> None:
    """The model ready for a capture: in eval mode (dropout off; a warning where it was
    training), an attention and experts implementation that replays; a final norm where
    one is asked for, else an ArchitectureError."""
    if model.training:
        warnings.warn(
            "the model was in training mode; calling model.eval() so that dropout is off.",
            stacklevel=3,
        )
        model.eval()
    if final_norm and spec.final_norm_path is None:
        raise ArchitectureError(
            f"final_norm=True, but the {spec.arch} model has no final norm "
            "(BERT-style encoders have none). Use final_norm=False or pass final_norm_path "
            "to find_blocks."
        )
    _ensure_attn_implementation(model)
    _ensure_experts_implementation(model)


def _call_inputs(model: nn.Module, inputs: Mapping[str, Tensor],
                 model_dtype: torch.dtype) -> dict[str, Any]:
    """``inputs`` on the model's input device (not "meta": an offloaded model's weights wait
    there), floating ones in the model's dtype; ``use_cache=False`` where it is accepted."""
    device = offload.input_device(model)

    def to_model(t: Tensor) -> Tensor:
        t = t.to(device)
        return t.to(model_dtype) if t.is_floating_point() else t

    call_inputs: dict[str, Any] = {k: _map_tensors(v, to_model) for k, v in inputs.items()}
    if _accepts_kwarg(model.forward, "use_cache"):
        call_inputs["use_cache"] = False
    return call_inputs


def _record(model: nn.Module, blocks: Sequence[nn.Module], norm: nn.Module | None,
            call_inputs: dict[str, Any]
            ) -> tuple[list[list[tuple[tuple[Any, ...], dict[str, Any]]]], list[list[Tensor]],
                       list[Tensor]]:
    """One forward pass with hooks: each block's calls (args, kwargs without caches) and
    outputs, and the final norm's outputs (``norm``: its module, else none recorded)."""
    raw_calls: list[list[tuple[tuple[Any, ...], dict[str, Any]]]] = [[] for _ in blocks]
    outputs: list[list[Tensor]] = [[] for _ in blocks]
    norm_out: list[Tensor] = []

    def make_pre(i: int) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            raw_calls[i].append(_strip_caches(args, kwargs))

        return hook

    def make_post(sink: list[Tensor]) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            sink.append(first_output(output).detach())

        return hook

    handles = []
    try:
        for i, block in enumerate(blocks):
            handles.append(block.register_forward_pre_hook(make_pre(i), with_kwargs=True))
            handles.append(block.register_forward_hook(make_post(outputs[i])))
        if norm is not None:
            handles.append(norm.register_forward_hook(make_post(norm_out)))
        with torch.no_grad():
            model(**forward_inputs(model, call_inputs))
    finally:
        for h in handles:
            h.remove()
    return raw_calls, outputs, norm_out


def _block_calls(raw_calls: list[list[tuple[tuple[Any, ...], dict[str, Any]]]],
                 outputs: list[list[Tensor]], spec: BlockSpec) -> list[BlockCall]:
    """Each block's one recorded call (where its hidden states went in, its input and
    output); an ArchitectureError where a block was not called exactly once."""
    calls: list[BlockCall] = []
    for i, (called, out) in enumerate(zip(raw_calls, outputs, strict=True)):
        if len(called) != 1 or len(out) != 1:
            raise ArchitectureError(
                f"block {i + 1} of '{spec.blocks_path}' was called {len(called)} times in "
                "one forward pass (expected once). Pass blocks_path= of a list of blocks that "
                "are each applied once."
            )
        args, kwargs = called[0]
        where = _hidden_location(args, kwargs)
        x_in = args[where] if isinstance(where, int) else kwargs[where]
        calls.append(BlockCall(args=args, kwargs=kwargs, hidden=where, input=x_in.detach(),
                               output=out[0]))
    return calls


def _checked_states(calls: list[BlockCall], final: Tensor | None) -> list[Tensor]:
    """The block boundaries x^0 .. x^L (the last one the final norm's output, where given):
    each (batch, tokens, hidden) and finite, else one line saying what to do."""
    x0 = calls[0].input
    if x0.ndim != 3:
        raise ArchitectureError(
            f"the first block received hidden states of shape {tuple(x0.shape)}; expected "
            "(batch, tokens, hidden). Pass blocks_path= of the transformer blocks."
        )
    if not torch.isfinite(x0).all():
        raise NumericalError("the input of block 1 (x^0) contains NaN or inf; check the inputs.")
    L = len(calls)
    states = [x0] + [c.output for c in calls]
    if final is not None:
        states[L] = final
    for layer, state in enumerate(states[1:], start=1):
        if state.shape != x0.shape:
            raise ArchitectureError(
                f"block {layer} output has shape {tuple(state.shape)}, its input {tuple(x0.shape)}; "
                "blocks must map (batch, tokens, hidden) to the same shape."
            )
        if not torch.isfinite(state).all():
            where = "the final norm after block" if (final is not None and layer == L) else "block"
            raise NumericalError(
                f"{where} {layer} output contains NaN or inf (layer {layer}). Run the model in a wider "
                "dtype (e.g. float32 instead of float16) or check the inputs."
            )
    return states


# ----------------------------------------------------------------------------- replay


def _as_dtype(module: nn.Module, dtype: torch.dtype,
              device: torch.device | None = None) -> nn.Module:
    """``module`` itself if its floating parameters are already in ``dtype`` (and on
    ``device``), else a converted copy: the user's model is never mutated, and a model bigger
    than the analysis device is streamed to it one block at a time."""
    ref = _first_float_param(module)
    if ref is None or (ref.dtype == dtype and (device is None or ref.device == device)):
        return module
    return copy.deepcopy(module).to(device=device or ref.device, dtype=dtype)


def _select_prompt(
    obj: Any, batch: int, prompt: int, dtype: torch.dtype, device: torch.device
) -> Any:
    """Slice batch tensors (ndim >= 2, shape[0] == B) to one prompt; cast floats to dtype."""

    def fn(t: Tensor) -> Tensor:
        if batch > 1 and t.ndim >= 2 and t.shape[0] == batch:
            t = t[prompt : prompt + 1]
        t = t.to(device)
        return t.to(dtype) if t.is_floating_point() else t

    return _map_tensors(obj, fn)


@dataclass
class BlockReplay:
    """One block's recorded call for one prompt, ready to be re-run in the analysis dtype on
    the analysis device (the pieces `residual_branch` and the fast path share)."""

    block: nn.Module  # the block, in the analysis dtype/device (a copy if needed)
    norm: nn.Module | None  # the final norm when folded into the last block
    args: tuple[Any, ...]  # recorded positional arguments, sliced to the prompt, cast
    kwargs: dict[str, Any]  # recorded keyword arguments, likewise
    where: int | str  # position or name of the hidden-state argument
    x: Tensor  # (n, d) the recorded block input
    recorded: Tensor  # (n, d) the recorded block output (before any folded final norm)
    device: torch.device


def check_call_index(cap: Capture, layer: int, prompt: int) -> list[BlockCall]:
    """Clear errors for a capture without calls, or a layer or prompt out of range; returns
    the recorded calls."""
    if cap.calls is None:
        raise BlockCouplingError(
            "this Capture was made with keep_calls=False; capture again with keep_calls=True."
        )
    L = len(cap.calls)
    if not 1 <= layer <= L:
        raise BlockCouplingError(f"layer {layer} is out of range: the model has layers 1..{L}.")
    if not 0 <= prompt < cap.batch_size:
        raise BlockCouplingError(
            f"prompt {prompt} is out of range: the batch has prompts 0..{cap.batch_size - 1}."
        )
    return cap.calls


def prepare_replay(model: nn.Module, cap: Capture, layer: int, prompt: int, *,
                   dtype: torch.dtype = torch.float32,
                   device: torch.device | str | None = None,
                   original: bool = False) -> BlockReplay:
    """Block ``layer``'s recorded call for ``prompt``, cast to ``dtype`` and moved to ``device``
    (default: where the block's weights are). Validates the layer, the prompt and eval mode.
    ``original``: the block (and final norm) without a wrapper's envelopes
    (`wrappers.without_bridges`: TransformerLens 4's bridge components), for the fast path,
    which checks the result against the recorded output."""
    calls = check_call_index(cap, layer, prompt)
    L, B = len(calls), cap.batch_size
    spec = cap.spec
    # accelerate-dispatched (offloaded) or quantized blocks: a plain, loaded copy (offload.py)
    block_orig = offload.materialize(get_blocks(model, spec)[layer - 1])
    use_norm = cap.final_norm and layer == L
    norm_orig = (
        offload.materialize(get_module(model, spec.final_norm_path))
        if (use_norm and spec.final_norm_path) else None
    )
    if original:
        block_orig = without_bridges(block_orig)
        norm_orig = without_bridges(norm_orig) if norm_orig is not None else None
    for mod in (block_orig, norm_orig):
        if mod is not None and mod.training:
            raise BlockCouplingError(
                f"block {layer} is in training mode (dropout on); call model.eval() before measuring."
            )
    call = calls[layer - 1]
    ref = _first_float_param(block_orig)
    dev = torch.device(device) if device is not None else (
        ref.device if ref is not None else call.input.device)
    return BlockReplay(
        block=_as_dtype(block_orig, dtype, dev),
        norm=_as_dtype(norm_orig, dtype, dev) if norm_orig is not None else None,
        args=_select_prompt(call.args, B, prompt, dtype, dev),
        kwargs=_select_prompt(call.kwargs, B, prompt, dtype, dev),
        where=call.hidden,
        x=call.input[prompt].detach().to(dev, dtype),
        recorded=call.output[prompt].detach().to(dev, dtype),
        device=dev,
    )


def replay_tolerance(cap: Capture, dtype: torch.dtype) -> float:
    """Relative tolerance of a replay: that of the lower of the model's and the analysis'
    precision (the recorded output is in the model's dtype)."""
    low = cap.model_dtype if torch.finfo(cap.model_dtype).eps > torch.finfo(dtype).eps else dtype
    return REPLAY_RTOL.get(low, 1e-2)


def relative_error(got: Tensor, ref: Tensor, real: Tensor | slice) -> float:
    """max |got - ref| / max |ref| over the real positions (inf/NaN-safe: NaN compares false)."""
    err = float((got - ref)[real].abs().max())
    scale = float(ref[real].abs().max())
    return err / max(scale, torch.finfo(ref.dtype).tiny)


def residual_branch(
    model: nn.Module,
    cap: Capture,
    layer: int,
    prompt: int,
    *,
    dtype: torch.dtype = torch.float32,
    check: bool = True,
    rtol: float | None = None,
    device: torch.device | str | None = None,
) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """The residual branch ``f^l(X) = F^l(X) - X`` of block ``layer`` for one prompt.

    Returns ``(f, x)``: ``f`` maps a hidden input (n, d) (n = the padded length of the batch;
    only real positions are meaningful) to (n, d) in ``dtype``; ``x`` (n, d) is the recorded
    input of the block for that prompt, in ``dtype`` on ``device`` (default: the block's own
    device). With ``cap.final_norm`` and ``layer == L``, ``F`` includes the final norm. The
    block is copied to ``dtype``/``device`` when its parameters are elsewhere (the user's model
    is never mutated). ``f`` is pure and works under ``torch.func`` transforms. With ``check``
    the replay ``f(x) + x`` is compared with the recorded output at real positions (relative
    max error, tolerance ``rtol`` or `REPLAY_RTOL`); a mismatch raises
    [`ReplayError`][blockcoupling.errors.ReplayError].
    """
    rp = prepare_replay(model, cap, layer, prompt, dtype=dtype, device=device)
    f = replay_branch(rp)
    if check:
        with torch.no_grad():
            got = f(rp.x) + rp.x  # (n, d)
        check_replay(cap, layer, prompt, rp, got, rtol)
    return f, rp.x


def replay_branch(rp: BlockReplay) -> Callable[[Tensor], Tensor]:
    """``f(h) = F(h) - h`` (n, d) -> (n, d) of a prepared replay (`prepare_replay`): the block
    (then the folded final norm) called with its recorded call, ``h`` in place of its hidden
    states. Pure; works under ``torch.func`` transforms. `residual_branch` is this, checked;
    the fast path's build-time check calls it on the replay it already holds (one dtype copy
    of the block per layer, not two)."""
    block, norm, args, kwargs, where = rp.block, rp.norm, rp.args, rp.kwargs, rp.where

    def f(h: Tensor) -> Tensor:  # (n, d) -> (n, d)
        h3 = h.unsqueeze(0)  # (1, n, d)
        if isinstance(where, int):
            a = args[:where] + (h3,) + args[where + 1 :]
            k = kwargs
        else:
            a = args
            k = {**kwargs, where: h3}
        with replay_context():
            out = first_output(block(*a, **k))
            if norm is not None:
                out = first_output(norm(out))
        return out.squeeze(0) - h

    return f


def check_replay(cap: Capture, layer: int, prompt: int, rp: BlockReplay, got: Tensor,
                 rtol: float | None = None) -> None:
    """Raise `ReplayError` unless ``got`` (n, d), the replay's ``F(x)``, is the recorded
    output at the real positions (relative max error, tolerance ``rtol`` or `REPLAY_RTOL`)."""
    dtype = rp.x.dtype
    recorded = (cap.final_output if rp.norm is not None
                else check_call_index(cap, layer, prompt)[layer - 1].output)
    assert recorded is not None
    ref_out = recorded[prompt].detach().to(rp.device, dtype)  # (n, d)
    real = cap.valid[prompt].to(rp.device)  # (n,)
    rel = relative_error(got, ref_out, real) if bool(real.any()) else 0.0
    tol = rtol if rtol is not None else replay_tolerance(cap, dtype)
    if not rel <= tol:  # also catches NaN
        raise ReplayError(
            f"replaying block {layer} (prompt {prompt}) did not reproduce its recorded output: "
            f"max relative error {rel:.3g} > {tol:.3g}. The block depends on something "
            "outside its recorded call (global state, randomness, a cache); make the model "
            "deterministic (model.eval()) or pass blocks_path= of other modules."
        )
