"""Loading a model and its tokenizer from a hub id or a local folder, with clear errors.

Thin I/O layer over ``transformers``: the base model (``AutoModel``) is enough, since
blockcoupling captures the blocks' own inputs and outputs and never needs a head.
Nothing is downloaded when ``HF_HUB_OFFLINE=1``; a hub id that is not in the local cache
then fails with a message that says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from blockcoupling import validate
from blockcoupling.errors import BlockCouplingError, require
from blockcoupling.fields import (
    GIVEN,
    OptionSpec,
    changed,
    check_fields,
    check_given,
    cli_options,
    opt,
    option_name,
)
from blockcoupling.progress import interactive

MODEL_DTYPES = {
    "auto": "auto",
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def resolve_device(device: str = "auto", name: str = "--device") -> torch.device:
    """The torch device of a ``--device`` name (``auto``: the GPU if one is visible, else the
    CPU); a device this torch was not built for, or this machine does not have (no CUDA GPU,
    an index past the last device), is one error line (`validate.device_name`, the one check
    of every device name, with ``present``)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(validate.device_name(device, name, present=True))


# Files that make a folder's tokenizer loadable (any one of them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")
HUB_PROBE_TIMEOUT_S = 3.0


@contextlib.contextmanager
def quiet_transformers(progress: bool) -> Iterator[None]:
    """Silence transformers' warnings (e.g. the load report listing a causal LM's unused
    ``lm_head``: blockcoupling loads the base model on purpose) and, unless ``progress``,
    its weight-loading progress bar; restore both afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    if not (progress and interactive()):  # no redrawn bar in a log file
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def save_model(model: Any, folder: Path, tokenizer: Any = None) -> None:
    """``save_pretrained`` of ``model`` (and ``tokenizer``) into ``folder`` without
    transformers' shard-writing bar or chatter (a study saves many checkpoints; its own
    progress says so). A write that fails for the operating system's reason (a full disk, a
    read-only folder) is an ``OSError`` whatever library raised it (`os_error_of`)."""
    with quiet_transformers(progress=False):
        try:
            model.save_pretrained(folder)
            if tokenizer is not None:
                tokenizer.save_pretrained(folder)
        except Exception as err:
            os_err = os_error_of(err, folder)
            if os_err is None or os_err is err:
                raise
            raise os_err from err


#: errno values of a write the disk or the folder refuses (not a bug, not damaged input)
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def os_error_of(err: BaseException, where: str | os.PathLike[str] | None = None
                ) -> OSError | None:
    """``err`` as the operating-system error it reports: itself if an ``OSError``, else one
    made from the ``(os error N)`` that safetensors' Rust writer puts in its message (a full
    disk while saving or offloading), else None."""
    if isinstance(err, OSError):
        return err
    found = re.search(r"os error (\d+)", str(err))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code), None if where is None else str(where))


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _in_hub_cache(name: str, revision: str | None) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json", revision=revision)
    except Exception:  # an invalid repo id, a broken cache: let from_pretrained explain
        return False
    return isinstance(found, str)


def _hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None if the hub's host accepts a connection within ``timeout`` seconds, else why not.
    (Behind an HTTP(S) proxy the probe is skipped: the proxy decides.)"""
    import socket

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    try:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    except Exception:
        endpoint = "https://huggingface.co"
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    result: list[str | None] = []

    def probe() -> None:  # getaddrinfo has no timeout of its own: run it in a thread
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as err:
            result.append(f"{host}: {err.strerror or err}")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return result[0] if result else f"{host}: no answer within {timeout:.0f} s"


def _looks_like_path(name: str) -> bool:
    """Explicit paths; ``org/name`` is a hub id unless such a folder exists."""
    return name.startswith((".", "/", "~")) or name.endswith(os.sep)


#: ``--quantize`` choices: the transformers quantization config each loads with, and the
#: package it needs
QUANTIZE = {"bnb-8bit": "bitsandbytes", "bnb-4bit": "bitsandbytes", "torchao-int8": "torchao"}
_QUANTIZE_CHOICES = ("none", *QUANTIZE)
#: the ``pip install`` of each package a loading option needs (the extra, where one has it)
INSTALL = {"bitsandbytes": "bitsandbytes", "torchao": "'blockcoupling[quant]'",
           "accelerate": "'blockcoupling[offload]'"}


def _writable_folder(path: Path, flag: str) -> None:
    """Create ``path`` if needed and check that files can be written there (before any
    weight is loaded): one line naming the folder otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".blockcoupling-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise BlockCouplingError(f"{flag} {path}: cannot write there ({err.strerror}); give a "
                                 "folder on a writable disk with free space") from err


def parse_max_memory(spec: str | None, name: str = "--max-memory"
                     ) -> dict[int | str, str] | None:
    """``"0=20GiB,cpu=60GiB"`` -> ``{0: "20GiB", "cpu": "60GiB"}`` (accelerate's max_memory)."""
    if spec is None or not spec.strip():
        return None
    out: dict[int | str, str] = {}
    for item in spec.split(","):
        dev, sep, size = item.strip().partition("=")
        if not sep or not dev.strip() or not size.strip():
            raise validate.OptionError(
                f"{name} {spec!r}: give DEVICE=SIZE pairs such as 0=20GiB,cpu=60GiB")
        dev = dev.strip()
        out[int(dev) if dev.isdigit() else dev] = size.strip()
    return out


def _max_memory(value: Any, name: str) -> str:
    """A ``max_memory`` option: text of DEVICE=SIZE pairs (`parse_max_memory`)."""
    parse_max_memory(validate.text(value, name, example="0=20GiB,cpu=60GiB"), name)
    return str(value)


#: accelerate's dispatch strategies (``device_map``; a device name also places the whole
#: model there)
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _device_map(value: Any, name: str) -> str:
    """A ``device_map``: a strategy of `DEVICE_MAPS` or a device this torch has."""
    if isinstance(value, str) and value in DEVICE_MAPS:
        return value
    try:
        return validate.device_name(value, name)
    except validate.OptionError:
        raise validate.OptionError(f"{name} {value!r}: choose {', '.join(DEVICE_MAPS)} (or a "
                                   "device name such as cpu)") from None


def quantization_config(quantize: str | None) -> Any:
    """The transformers quantization config of a ``--quantize`` choice (None: none; the
    choice is `ModelSource`'s check); a backend that is not installed is one clear error."""
    if quantize is None or quantize == "none":
        return None
    validate.choice(quantize, "--quantize", choices=_QUANTIZE_CHOICES)
    package = QUANTIZE[quantize]
    require(package, what=f"--quantize {quantize}", install=INSTALL[package],
            alternative="or measure without --quantize")
    import transformers as tf

    if package == "torchao":
        from torchao.quantization import Int8WeightOnlyConfig

        return tf.TorchAoConfig(Int8WeightOnlyConfig())
    return tf.BitsAndBytesConfig(load_in_8bit=quantize == "bnb-8bit",
                                 load_in_4bit=quantize == "bnb-4bit",
                                 bnb_4bit_compute_dtype=torch.float32)


def init_meta(init: str = "pretrained", seed: int = 0) -> dict[str, Any]:
    """What a run's meta records of its weights' origin: ``init`` (``pretrained`` or
    ``random``) and, for random weights, ``init_seed`` (both part of the resume identity)."""
    return {"init": init, **({"init_seed": seed} if init == "random" else {})}


def random_init(config: Any, seed: int = 0, *, head: bool = False,
                trust_remote_code: bool = False) -> Any:
    """The architecture of ``config`` at random initialisation, in eval mode: transformers'
    own initialisation (``from_config``) under ``torch.manual_seed(seed)`` inside a forked
    RNG, so the weights depend only on the config and the seed and the global random state is
    left untouched. ``head``: with the causal-LM head (``AutoModelForCausalLM``)."""
    from transformers import AutoModel, AutoModelForCausalLM

    auto = AutoModelForCausalLM if head else AutoModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(config, trust_remote_code=trust_remote_code)
    return model.eval()


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from and how it is loaded, as one record: the hub id or folder,
    its revision, dtype and device, remote code, accelerate's dispatch, quantization, missing
    weights and a seeded random init.

    Each field is declared once with `blockcoupling.fields.opt`: the loading options of
    ``measure`` and ``perturb`` (`source_options`), a sweep spec's model keys (top-level
    defaults, per-model values) and a sweep unit's model all are this record, so a new
    loading option is one field here. Its values are checked when it is made (types, dtype,
    device, init and seed, a random init without dispatch or quantization); what needs the
    machine (accelerate, a quantization backend, a writable offload folder, the device, the
    hub) when it is loaded (`load`)."""

    model: str | None = opt(None, "Hub id or local model folder.",
                            check=(validate.text, {"example": "gpt2 (a hub id) or ./model (a folder)"}))
    revision: str | None = opt(None, "Model revision (branch, tag, commit, e.g. step1000).",
                               cli=True, check=(validate.text, {"example": "step1000"}))
    dtype: str = opt("auto", "Model weight dtype: auto, float32, bfloat16, float16, float64.",
                     cli=True,
                     check=(validate.dtype_name, {}))
    device: str = opt("auto", "Where the model runs: auto (a CUDA GPU if one is visible, else "
                      "the CPU), cpu, cuda, cuda:N, or another device torch knows (mps, xpu).",
                      cli=True,
                      check=(validate.device_name, {}))
    trust_remote_code: bool = opt(
        False, "Run the model repository's own Python code (transformers trust_remote_code); "
        "only for repositories you trust.", cli=True, check=(validate.flag, {}))
    device_map: str | None = opt(
        None, "Dispatch the model with accelerate (auto, balanced, sequential): blocks on "
        "several devices, some offloaded; measured one block at a time.", cli=True,
        check=validate.rule(_device_map))
    max_memory: str | None = opt(
        None, "With --device-map: memory per device, e.g. 0=20GiB,cpu=60GiB.", cli=True,
        check=validate.rule(_max_memory), requires=("device_map", GIVEN))
    offload_folder: str | None = opt(
        None, "With --device-map: folder for blocks offloaded to disk.", cli=True,
        check=(validate.text, {"example": "offload"}), requires=("device_map", GIVEN))
    quantize: str | None = opt(
        None, "Load the weights in 8 or 4 bits: bnb-8bit, bnb-4bit (bitsandbytes), "
        "torchao-int8; each block is dequantized to the analysis dtype.", cli=True,
        check=validate.rule(validate.choice, choices=_QUANTIZE_CHOICES))
    allow_missing_weights: bool = opt(
        False, "Measure a checkpoint that lacks weights its config describes (or holds block "
        "weights it does not describe): those are initialised under a fixed seed and listed "
        "in the run's meta. Without it such a checkpoint is refused.", cli=True,
        check=(validate.flag, {}))
    init: str = opt(
        "pretrained", "pretrained (the checkpoint's weights) or random: the same config with "
        "seeded random weights (the untrained baseline of the paper's figures 3, 4 and 23; "
        "recorded in the run's meta and identity).", cli=True, check=(validate.init_name, {}))
    init_seed: int = opt(0, "Seed of --init random.", cli=True, check=validate.SEED,
                         requires=("init", "random"))

    def __post_init__(self) -> None:
        """The values' checks; a message names the option as the CLI writes it
        (``--init-seed``) or, inside `fields.key_names`, as a spec's key."""
        for f in fields(self):  # a field whose default is not None takes no None either
            if getattr(self, f.name) is None and f.default is not None:
                check, bounds = f.metadata["check"]
                check(None, option_name(f.name, prefix="--"), **bounds)
        check_fields(self, prefix="--")

        def name(f: str) -> str:
            return option_name(f, prefix="--")

        if self.init == "random" and (self.device_map is not None
                                      or self.quantize not in (None, "none")):
            raise validate.OptionError(
                f"{name('init')} random builds the model in memory; {name('device_map')} and "
                f"{name('quantize')} apply to checkpoints only (drop them)")
        # the rules between options (``requires``) on what was set: a command line and a
        # spec check them on what was given (an explicit --init-seed 0 too)
        check_given(type(self), changed(self), vars(self), prefix="--")

    def meta(self, **extra: Any) -> dict[str, Any]:
        """What a run's meta records of its model: ``model``, ``revision``, the caller's
        ``extra`` keys (``prompts_spec``, a unit's label...), then the weights' origin
        (`init_meta`)."""
        return {"model": self.model, "revision": self.revision, **extra,
                **init_meta(self.init, self.init_seed)}

    def load(self, *, require_tokenizer: bool = False, progress: bool = True,
             head: bool = False) -> tuple[Any, Any]:
        """``(model, tokenizer)``: see `load_model` for what each option does and what is
        refused."""
        if not self.model:
            raise BlockCouplingError("give the model: a hub id or a local model folder")
        dispatch = self._dispatch()
        with quiet_transformers(progress):
            return _load(self.model, revision=self.revision, dtype=self.dtype,
                         device=self.device, trust_remote_code=self.trust_remote_code,
                         require_tokenizer=require_tokenizer, dispatch=dispatch,
                         allow_missing_weights=self.allow_missing_weights, head=head,
                         init=self.init, init_seed=self.init_seed)

    def _dispatch(self) -> dict[str, Any]:
        """``from_pretrained``'s keywords of accelerate's dispatch and of quantization,
        checked against this machine (accelerate and the backend installed, the offload
        folder writable) before any weight is read."""
        dispatch: dict[str, Any] = {}
        if self.device_map is not None:
            require("accelerate", what="--device-map", install=INSTALL["accelerate"],
                    alternative="or measure without --device-map")
            dispatch.update(device_map=self.device_map,
                            max_memory=parse_max_memory(self.max_memory),
                            offload_folder=self.offload_folder)
            if self.offload_folder is not None:
                _writable_folder(Path(self.offload_folder).expanduser(), "--offload-folder")
        qc = quantization_config(self.quantize)
        if qc is not None:
            dispatch["quantization_config"] = qc
        return dispatch


def source_options(*, exclude: tuple[str, ...] = ()) -> list[OptionSpec]:
    """The CLI options of `ModelSource` (``--model`` is the command's own, with ``-m``),
    less ``exclude``: a command that loads a model takes these."""
    return cli_options(ModelSource, exclude=exclude)


def load_model(name: str, *, revision: str | None = None, dtype: str = "auto",
               device: str = "auto", trust_remote_code: bool = False,
               require_tokenizer: bool = False, progress: bool = True,
               device_map: str | None = None, max_memory: str | None = None,
               offload_folder: str | None = None, quantize: str | None = None,
               allow_missing_weights: bool = False, head: bool = False,
               init: str = "pretrained", init_seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a hub id or a local folder, in eval mode on ``device``:
    ``ModelSource(model=name, ...).load(...)`` (`ModelSource`).

    ``head``: the causal LM with its unembedding (``AutoModelForCausalLM``, for the logit
    lens) instead of the base model. ``init="random"``: the same config with seeded random
    weights (`random_init`, ``init_seed``; the untrained baselines of the paper's
    figures 3, 4 and 23): no weight file is read, the tokenizer is the checkpoint's; a
    ``dtype`` of ``auto`` is then the config's own dtype (float32 where it names none).

    ``device_map`` (``"auto"``, ``"balanced"``, ...; with ``max_memory`` such as
    ``"0=20GiB,cpu=60GiB"`` and ``offload_folder`` for blocks offloaded to disk) dispatches
    the model with accelerate instead of moving it to ``device``; ``quantize`` loads it in
    8 or 4 bits (`QUANTIZE`). Both are measured one block at a time
    (engine/offload.py).

    ``tokenizer`` is None for a model without one (vision models), unless
    ``require_tokenizer`` (text prompts), which makes that an error. ``progress=False``
    hides transformers' weight-loading bar. A hub id that is neither cached nor reachable
    fails at once (no retries) with a message naming the ways out.

    The model is loaded completely or refused (`check_load_report`): weights the
    checkpoint lacks, or holds beyond what the config describes, are one error naming them,
    unless ``allow_missing_weights`` (then they are initialised under a fixed seed and listed
    in the run's ``meta["loading"]``); a loading error names its cause (the config, the
    architecture or the weights)."""
    source = ModelSource(model=name, revision=revision, dtype=dtype, device=device,
                         trust_remote_code=trust_remote_code, device_map=device_map,
                         max_memory=max_memory, offload_folder=offload_folder,
                         quantize=quantize, allow_missing_weights=allow_missing_weights,
                         init=init, init_seed=init_seed)
    return source.load(require_tokenizer=require_tokenizer, progress=progress, head=head)


def _load(name: str, *, revision: str | None, dtype: str, device: str, trust_remote_code: bool,
          require_tokenizer: bool, dispatch: dict[str, Any] | None = None,
          allow_missing_weights: bool = False, head: bool = False,
          init: str = "pretrained", init_seed: int = 0) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoTokenizer

    path = Path(name).expanduser()
    if _looks_like_path(name) and not path.exists():
        raise BlockCouplingError(f"model path {name!r} does not exist; give a local folder "
                                 "with config.json or a hub id such as gpt2")
    if path.exists() and not (path / "config.json").exists():
        raise BlockCouplingError(f"{name!r} has no config.json: is it a HuggingFace model folder "
                                 "(saved with save_pretrained)?")
    src = str(path) if path.exists() else name
    if not path.exists() and not _offline() and not _in_hub_cache(name, revision):
        why = _hub_reachable()
        if why is not None:
            raise BlockCouplingError(
                f"model {name!r} is not a local folder and not in the local cache, and the "
                f"Hugging Face hub cannot be reached ({why}); give a local model folder "
                "(--model ./path/to/model), or set HF_HUB_OFFLINE=1 to use the local cache"
            )
    try:
        config = AutoConfig.from_pretrained(src, revision=revision, trust_remote_code=trust_remote_code)
    except ValueError as err:  # a config that parses but names a model type not known here
        raise BlockCouplingError(
            f"the architecture of {name!r} is not one this transformers "
            f"({_transformers_version()}) knows: {_first_line(err)}; upgrade transformers, or "
            "give --trust-remote-code for a model that ships its own code") from err
    except OSError as err:
        offline = _offline()
        raise BlockCouplingError(
            f"could not load the model config of {name!r}"
            + (" (HF_HUB_OFFLINE=1: only models already in the local cache load)" if offline else "")
            + f": {_first_line(err)}"
        ) from err
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    kwargs["dtype"] = MODEL_DTYPES[dtype]
    kwargs.update({k: v for k, v in (dispatch or {}).items() if v is not None})
    target = resolve_device(device)
    if init == "random":
        try:
            model = random_init(config, init_seed, head=head,
                                trust_remote_code=trust_remote_code)
        except Exception as err:  # noqa: BLE001 - the model's own checks of its config
            raise _load_error(name, config, kwargs, err, head=head) from err
        want = MODEL_DTYPES[dtype] if dtype != "auto" else getattr(config, "dtype", None)
        if isinstance(want, str):
            want = MODEL_DTYPES.get(want.removeprefix("torch."))
        model = model.to(want if isinstance(want, torch.dtype) else torch.float32)
    else:
        model = _from_pretrained(name, src, config, kwargs, allow_missing_weights, head=head)
    # a dispatched (device_map) or quantized model stays where transformers put it
    model = (model if "device_map" in kwargs or "quantization_config" in kwargs
             else model.to(target)).eval()
    tokenizer = None
    has_files = not path.exists() or any((path / f).exists() for f in TOKENIZER_FILES)
    if has_files:
        try:
            tokenizer = AutoTokenizer.from_pretrained(src, revision=revision,
                                                      trust_remote_code=trust_remote_code)
        except Exception:  # vision models have none; a broken one is reported below
            tokenizer = None
    if tokenizer is not None and not _tokenizes(tokenizer):
        tokenizer = None  # e.g. a tokenizer class without its vocabulary files
    if tokenizer is None and require_tokenizer:
        where = f"the folder {name!r}" if path.exists() else f"the model {name!r}"
        raise BlockCouplingError(
            f"{where} has no usable tokenizer (none of {', '.join(TOKENIZER_FILES[:4])}, ...); "
            "save the model's tokenizer next to it with tokenizer.save_pretrained(folder)"
        )
    return model, tokenizer


#: modules of a base model that the measurement never reads and that task checkpoints often
#: lack (a BERT's or ViT's ``pooler``, added by ``AutoModel`` but not by the task models):
#: their missing weights are reported in ``meta["loading"]`` but not refused
UNUSED_MODULES = ("pooler",)
#: the attribute of a loaded model that holds its load report (read by `load_report`)
_REPORT_ATTR = "_blockcoupling_load_report"
#: the seed of whatever ``from_pretrained`` initialises (weights a checkpoint lacks, accepted
#: with ``allow_missing_weights``): the same model on every call
INIT_SEED = 0


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def _module_of(key: str) -> str:
    """The module a weight belongs to, down to its block: ``h.2.attn.c_attn.weight`` ->
    ``h.2``; keys outside an indexed list give their parent module (``ln_f``)."""
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or key


def _names(keys: set[str]) -> str:
    """``h.2 (12 tensors), h.3 (12 tensors)``: keys grouped by module, at most 4 named."""
    groups: dict[str, int] = {}
    for k in sorted(keys):
        groups[_module_of(k)] = groups.get(_module_of(k), 0) + 1
    named = [f"{m} ({n} tensor{'s' if n > 1 else ''})" for m, n in list(groups.items())[:4]]
    more = f" and {len(groups) - 4} more modules" if len(groups) > 4 else ""
    return ", ".join(named) + more


def check_load_report(model: Any, info: Mapping[str, Any], name: str, *,
                      allow_missing_weights: bool = False) -> dict[str, Any]:
    """What a ``from_pretrained(..., output_loading_info=True)`` report means for a
    measurement, as the dict recorded in ``meta["loading"]``; BlockCouplingError if the model
    is not loaded completely:

    * **missing** weights (the config describes them, the checkpoint lacks them: transformers
      initialises them at random) are refused, except in `UNUSED_MODULES`;
    * **unexpected** weights of the model's own modules (``h.3.*`` where the config names 3
      blocks) are refused; unexpected weights of modules the base model does not have (a
      causal LM's ``lm_head``, a classifier) are the head blockcoupling leaves out, ignored;
    * weights whose **shapes** differ from the config's are always refused (the config does
      not describe these weights).

    ``allow_missing_weights`` accepts the first two knowingly: they are listed in the
    returned report (``accepted: true``) and initialised under `INIT_SEED`."""
    def keys(field: str) -> set[str]:
        return {k[0] if isinstance(k, (tuple, list)) else str(k) for k in info.get(field) or ()}

    children = {n for n, _ in model.named_children()}
    missing_all = keys("missing_keys")
    missing = {k for k in missing_all if k.split(".")[0] not in UNUSED_MODULES}
    unexpected = {k for k in keys("unexpected_keys") if k.split(".")[0] in children}
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: str(m))
    report: dict[str, Any] = {"missing": sorted(missing_all), "unexpected": sorted(unexpected),
                              "accepted": False}
    if mismatched:
        first = mismatched[0]
        shapes = (f" (the checkpoint {list(first[1])}, the config {list(first[2])})"
                  if isinstance(first, (tuple, list)) and len(first) == 3 else "")
        bad = {m[0] if isinstance(m, (tuple, list)) else str(m) for m in mismatched}
        raise BlockCouplingError(
            f"the config of {name!r} does not match its weights: {len(bad)} tensors have "
            f"other shapes, e.g. {sorted(bad)[0]}{shapes}, in {_names(bad)}; fix config.json "
            "(hidden size, heads, vocabulary) or save the model again with save_pretrained")
    if (missing or unexpected) and not allow_missing_weights:
        what = []
        if missing:
            what.append(f"lack {len(missing)} tensors the config describes: {_names(missing)} "
                        "(transformers would initialise them at random)")
        if unexpected:
            what.append(f"hold {len(unexpected)} tensors the config does not describe: "
                        f"{_names(unexpected)}")
        raise BlockCouplingError(
            f"the weights of {name!r} " + " and ".join(what) + "; fix the checkpoint or its "
            "config.json (e.g. its number of layers), or give --allow-missing-weights to "
            "measure it knowingly (recorded in the run's meta)")
    report["accepted"] = bool(missing or unexpected)
    return report


def load_report(model: Any) -> dict[str, Any] | None:
    """The load report `load_model` attached to ``model`` (None: not loaded by it)."""
    report = getattr(model, _REPORT_ATTR, None)
    return dict(report) if isinstance(report, dict) else None


def _from_pretrained(name: str, src: str, config: Any, kwargs: dict[str, Any],
                     allow_missing_weights: bool, *, head: bool = False) -> Any:
    """``AutoModel.from_pretrained`` (``AutoModelForCausalLM`` with ``head``: the logit lens
    needs the unembedding) with transformers' load report checked (`check_load_report`) and
    attached to the model; whatever it initialises is seeded (`INIT_SEED`). A failure is one
    line naming its cause (`_load_error`)."""
    from transformers import AutoModel, AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM if head else AutoModel

    extra: dict[str, Any] = {"output_loading_info": True}
    if "quantization_config" not in kwargs:  # report other shapes instead of raising on them
        extra["ignore_mismatched_sizes"] = True
    try:
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda):  # the caller's RNGs are left as they were
            torch.manual_seed(INIT_SEED)  # every device's generator
            model, info = auto.from_pretrained(src, config=config, **kwargs, **extra)
    except Exception as err:  # noqa: BLE001 - transformers, safetensors, torch and OS errors
        raise _load_error(name, config, kwargs, err, head=head) from err
    if head:
        _check_head_loaded(model, info, name)
    report = check_load_report(model, info, name, allow_missing_weights=allow_missing_weights)
    setattr(model, _REPORT_ATTR, report)
    return model


def _check_head_loaded(model: Any, info: Mapping[str, Any], name: str) -> None:
    """The logit lens reads the checkpoint's own output head: refuse one that transformers
    initialised at random (missing weights outside the base model), even where
    ``--allow-missing-weights`` accepts missing weights of the blocks."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    missing = sorted(str(k[0] if isinstance(k, (tuple, list)) else k)
                     for k in info.get("missing_keys") or ())
    outside = [k for k in missing if prefix and k.split(".")[0] != prefix]
    if outside:
        raise BlockCouplingError(
            f"--logit-lens needs the output head of {name!r}, but its checkpoint has none "
            f"({len(outside)} head tensors missing, e.g. {outside[0]}; transformers would "
            "initialise them at random; an encoder such as BERT has no next-token head): measure it "
            "without --logit-lens")


def _load_error(name: str, config: Any, kwargs: Mapping[str, Any],
                err: BaseException, *, head: bool = False) -> BlockCouplingError:
    """The one line of a failed ``from_pretrained``, naming its cause: an architecture
    ``AutoModel`` cannot build, a config whose values make no model (tried on the ``meta``
    device: nothing is allocated), or else the weights (missing or damaged files)."""
    from transformers import MODEL_MAPPING, AutoModel

    first = f"{type(err).__name__}: {_first_line(err)}"
    os_err = os_error_of(err, kwargs.get("offload_folder"))
    if os_err is not None and os_err.errno in WRITE_ERRNOS:
        where = os_err.filename or kwargs.get("offload_folder") or "a folder"
        return BlockCouplingError(
            f"cannot write {where} while loading {name!r} ({os_err.strerror}); free space "
            "on that disk or give another --offload-folder (on a writable disk), then run the "
            "same command again")
    remote = "AutoModel" in (getattr(config, "auto_map", None) or {})
    if head and isinstance(err, ValueError) and "Unrecognized configuration" in str(err):
        return BlockCouplingError(  # e.g. an encoder: no causal-LM class for its config
            f"{name!r} has no causal-LM head transformers knows; the logit lens needs a "
            "decoder with its unembedding (measure without --logit-lens)")
    if isinstance(err, ImportError):
        return BlockCouplingError(f"loading {name!r} needs a package that is not installed "
                                  f"({first}); install it and try again")
    if type(config) not in MODEL_MAPPING and not remote:
        return BlockCouplingError(
            f"the architecture of {name!r} ({type(config).__name__}) has no base model in "
            f"this transformers ({_transformers_version()}): {first}; measure a model with "
            "blocks (a decoder, an encoder or a ViT), or upgrade transformers")
    try:
        with torch.device("meta"):
            AutoModel.from_config(config, trust_remote_code=kwargs.get("trust_remote_code",
                                                                       False))
    except Exception as cfg_err:  # noqa: BLE001 - the model's own checks of its config
        return BlockCouplingError(
            f"the config of {name!r} does not describe a model transformers can build "
            f"({type(cfg_err).__name__}: {_first_line(cfg_err)}); fix config.json")
    return BlockCouplingError(
        f"could not load the weights of {name!r} ({first}); the weight files are missing or "
        "damaged: save the model again with save_pretrained or download it again")


def _tokenizes(tokenizer: Any) -> bool:
    """True if the tokenizer turns ordinary text into at least one token."""
    try:
        ids = tokenizer("The cat sat on the mat.", add_special_tokens=False)["input_ids"]
        return len(ids) > 0 and len(tokenizer) > 1
    except Exception:
        return False
