"""Loading a model and its tokenizer from a hub id or a local folder, with clear errors.

Thin I/O layer over ``transformers``: the base model (``AutoModel``) is enough, since
blockcoupling captures the blocks' own inputs and outputs and never needs a head.
Nothing is downloaded when ``HF_HUB_OFFLINE=1``; a hub id that is not in the local cache
then fails with a message that says so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from blockcoupling.errors import BlockCouplingError

MODEL_DTYPES = {
    "auto": "auto",
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BlockCouplingError(f"--device {device}: no CUDA GPU is visible; use --device cpu")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise BlockCouplingError(f"--device {device!r} is not a device torch knows (auto, cpu, cuda, cuda:1)") from err


def _looks_like_path(name: str) -> bool:
    """Explicit paths; ``org/name`` is a hub id unless such a folder exists."""
    return name.startswith((".", "/", "~")) or name.endswith(os.sep)


def load_model(name: str, *, revision: str | None = None, dtype: str = "auto",
               device: str = "auto", trust_remote_code: bool = False) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a hub id or a local folder, in eval mode on ``device``."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    if dtype not in MODEL_DTYPES:
        raise BlockCouplingError(f"--dtype {dtype!r}: choose one of {', '.join(MODEL_DTYPES)}")
    path = Path(name).expanduser()
    if _looks_like_path(name) and not path.exists():
        raise BlockCouplingError(f"model path {name!r} does not exist; give a local folder "
                                 "with config.json or a hub id such as gpt2")
    if path.exists() and not (path / "config.json").exists():
        raise BlockCouplingError(f"{name!r} has no config.json: is it a HuggingFace model folder "
                                 "(saved with save_pretrained)?")
    src = str(path) if path.exists() else name
    try:
        config = AutoConfig.from_pretrained(src, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise BlockCouplingError(
            f"could not load the model config of {name!r}"
            + (" (HF_HUB_OFFLINE=1: only models already in the local cache load)" if offline else "")
            + f": {str(err).splitlines()[0]}"
        ) from err
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    kwargs["dtype"] = MODEL_DTYPES[dtype]
    try:
        model = AutoModel.from_pretrained(src, config=config, **kwargs)
    except (OSError, ValueError) as err:
        raise BlockCouplingError(f"could not load the weights of {name!r}: {str(err).splitlines()[0]}") from err
    model = model.to(resolve_device(device)).eval()
    tokenizer = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, revision=revision,
                                                  trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError):
        tokenizer = None  # vision models: the caller passes ready inputs
    return model, tokenizer
