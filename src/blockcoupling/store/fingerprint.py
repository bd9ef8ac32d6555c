"""What identifies the measured thing: a fingerprint of the model's weights and the versions
of the software that measured it."""

from __future__ import annotations

import hashlib
import math
import platform
from importlib import metadata as _metadata

import torch

# weights_hash: models up to this many bytes of state are hashed in full, larger ones sampled.
FULL_HASH_MAX_BYTES = 512 * 2**20
SAMPLES_PER_TENSOR = 4096


def library_versions() -> dict[str, str]:
    """Versions of blockcoupling, its main libraries, Python and the platform."""
    out: dict[str, str] = {}
    for dist in ("blockcoupling", "torch", "transformers", "numpy", "pandas", "pyarrow"):
        try:
            out[dist] = _metadata.version(dist)
        except _metadata.PackageNotFoundError:
            out[dist] = "not installed"
    out["python"] = platform.python_version()
    out["platform"] = platform.platform()
    return out


def _plain_tensors(t: torch.Tensor, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """``t`` itself, or for a tensor subclass that wraps others (``__tensor_flatten__``, e.g.
    torchao's quantized weights) its inner tensors, named ``:attr``."""
    if type(t) in (torch.Tensor, torch.nn.Parameter) or not hasattr(t, "__tensor_flatten__"):
        return [(prefix, t)]
    names, _ = t.__tensor_flatten__()
    return [x for n in names for x in _plain_tensors(getattr(t, n), f"{prefix}:{n}")]


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a (small) tensor, any dtype (bfloat16 included)."""
    flat = t.detach().reshape(-1).contiguous().cpu()
    return flat.view(torch.uint8).numpy().tobytes()


def weights_hash(model: torch.nn.Module, *, max_full_bytes: int = FULL_HASH_MAX_BYTES) -> str:
    """A fingerprint of a model's weights: ``"sha256-full:<hex>"`` or ``"sha256-sampled:<hex>"``.

    The sha256 runs over every entry of ``model.state_dict()`` (parameters and persistent
    buffers) in order: its name, shape and dtype, then its values. If the whole state holds at
    most ``max_full_bytes`` bytes (512 MiB by default) the values are hashed byte for byte
    ("full"); otherwise each tensor contributes a deterministic strided sample of at most
    ``SAMPLES_PER_TENSOR`` elements (every ``ceil(numel / 4096)``-th element, plus the last),
    which is cheap for billion-parameter models yet changes with any retraining ("sampled").
    Tensors on the ``meta`` device contribute only name, shape and dtype.
    """
    # quantized weights (torchao tensor subclasses): their plain inner tensors
    state = {f"{name}{sub}": x for name, t in model.state_dict().items()
             for sub, x in _plain_tensors(t)}
    total = sum(t.numel() * t.element_size() for t in state.values() if t.device.type != "meta")
    full = total <= max_full_bytes
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}\n".encode())
        if t.device.type == "meta" or t.numel() == 0:
            continue
        if full:
            h.update(_tensor_bytes(t))
        else:
            flat = t.detach().reshape(-1)
            stride = max(1, math.ceil(flat.numel() / SAMPLES_PER_TENSOR))
            h.update(_tensor_bytes(flat[::stride]))
            h.update(_tensor_bytes(flat[-1:]))
    return f"sha256-{'full' if full else 'sampled'}:{h.hexdigest()}"
