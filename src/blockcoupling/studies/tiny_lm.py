"""The demo's tiny causal LM: configuration, corpus, tokenizer, training and its cache.

**A tiny pre-LN causal LM** (GPT-2 architecture, built from a `transformers.GPT2Config`)
with a character-level tokenizer, trained here on the help texts in `pydoc_data.topics`
and measured at several checkpoints from step 0 on: a toy-scale version of the paper's
training curves (fig. 1b). The hyperparameters in `TinyLMConfig` are fixed and
documented; they were chosen as a sensible small character LM that trains in about a minute on
two cores, and are *not* tuned to make the coupling curves resemble the paper's. Training is
deterministic under its seed (fixed data order, ``torch.use_deterministic_algorithms``) for a
given machine, torch version and thread count, and its checkpoints are cached (see
`train_tiny_lm`). Used by `blockcoupling.studies.demo` and
`blockcoupling.studies.lm_study` (both import it; it imports neither).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import time
import unicodedata
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from blockcoupling import validate
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, identity, opt
from blockcoupling.hashing import canonical_hash
from blockcoupling.jsonsafe import dumps
from blockcoupling.loading import save_model
from blockcoupling.studies.schedule import lr_at

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

#: Bumped whenever the corpus cleaning, tokenizer or training loop changes in a way that changes
#: the trained weights or what the cache holds; part of the cache key so stale caches are never
#: reused. 2: the cache also holds the training-time monitor's measurements (``monitor/``).
CACHE_FORMAT = 2

#: The folder (in a trained config's cache folder) of what the monitor measured during training.
MONITOR_DIR = "monitor"

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"

# In the register of the pydoc help texts (the tiny LM's training data); every character is
# a token, so these are 15-18 tokens long.
_CORPUS_PROMPTS = (
    'The "if" statement',
    "A function call",
    "The return value",
)


def _k_values(d: int, quick: bool) -> tuple[int, ...]:
    """K = 10 (the paper's training-curve K) and K = d/10 (its generalisation K), capped at d."""
    ks = {min(10, d), max(1, round(d / 10))}
    return (min(ks),) if quick else tuple(sorted(ks))



# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------
_AT_LEAST_1 = (validate.whole, {"minimum": 1})
LR_SCHEDULES = ("cosine", "constant")


def _schedule(value: Any, name: str) -> str:
    if value not in LR_SCHEDULES:
        raise validate.OptionError(f"{name} must be cosine or constant, not {value!r}")
    return str(value)


@dataclass(frozen=True)
class TinyLMConfig:
    """Every hyperparameter of the tiny LM: architecture, optimiser, data, seed, checkpoints.

    The defaults describe a 6-layer, d = 128, 4-head pre-LN GPT (1.2 M parameters, context 64)
    trained with AdamW for 400 steps on batches of 16 windows of 64 characters (410 k
    characters, about one pass over the 450 k-character training split): a standard small
    character LM in the style of nanoGPT's ``shakespeare_char``, scaled to two CPU cores
    (about a minute of training; held-out loss about 2.0 nats per character at step 400). Dropout is off (tiny model, short run, and
    it keeps the forward pass deterministic for the measurement). The learning rate warms up
    linearly for ``warmup_steps`` and then follows a cosine to ``min_lr_ratio * lr``
    (``lr_schedule="cosine"``) or stays at ``lr`` (``"constant"``: for runs whose end is
    decided by the data, so that the schedule does not depend on the cap).

    **Stopping at a plateau** (``plateau_tol``; off by default): the held-out loss is checked
    at each checkpoint, which must then be step 0 and the powers of two up to ``max_steps`` (a
    power of two: the cap), and training stops at the first checkpoint ``s >= min_steps``
    where it improved by less than ``plateau_tol`` relative over the last doubling of steps,
    ``(L(s/2) - L(s)) / L(s/2) < plateau_tol`` (a rise counts as no improvement). The steps
    and the outcome are in the training log (``end_step``, ``plateau``); only the checkpoints
    up to ``end_step`` exist. ``val_windows=0`` evaluates the whole held-out split in
    non-overlapping windows of ``block_size`` (no sampling: the same tokens at every check);
    ``train_chars`` keeps only the first ``train_chars`` characters of the training split
    (a data size). The three fields left at their defaults leave the cache key as it was.
    """

    n_layer: int = opt(6, "Blocks.", check=_AT_LEAST_1)
    n_embd: int = opt(128, "Width d of the residual stream.", check=_AT_LEAST_1)
    n_head: int = opt(4, "Attention heads (n_embd is a multiple of it).", check=_AT_LEAST_1)
    block_size: int = opt(64, "Context length of the model and of each training window.",
                          check=_AT_LEAST_1)
    batch_size: int = opt(16, "Training windows per step.", check=_AT_LEAST_1)
    max_steps: int = opt(400, "Training steps (with plateau_tol: the cap, a power of two).",
                         check=validate.COUNT0)
    checkpoints: tuple[int, ...] = opt((0, 25, 50, 100, 200, 400),
                                       "Steps saved: increasing, distinct, within 0..max_steps.",
                                       check=validate.COUNT0)
    lr: float = opt(3e-3, "Peak learning rate (AdamW).",
                    check=validate.rule(validate.number, above=0))
    min_lr_ratio: float = opt(0.1, "The cosine's end, relative to lr.",
                              check=validate.rule(validate.number, minimum=0, maximum=1))
    warmup_steps: int = opt(20, "Steps of the linear warm-up.", check=validate.COUNT0)
    weight_decay: float = opt(0.1, "AdamW weight decay, on matrices only (not biases, norms).",
                              check=validate.rule(validate.number, minimum=0))
    beta1: float = opt(0.9, "AdamW beta1.", check=validate.rule(validate.number, minimum=0,
                                                                 below=1))
    beta2: float = opt(0.95, "AdamW beta2.", check=validate.rule(validate.number, minimum=0,
                                                                  below=1))
    grad_clip: float = opt(1.0, "Gradient norm clip.",
                           check=validate.rule(validate.number, above=0))
    val_every: int = opt(10, "Every val_every-th pydoc topic (sorted by key) is held out.",
                         check=_AT_LEAST_1)
    val_windows: int = opt(16, "Held-out windows of the validation loss; 0: the whole split.",
                           check=validate.COUNT0)
    seed: int = opt(0, "Seed of the initialisation and the batches.", check=validate.SEED)
    lr_schedule: str = opt("cosine", "After the warm-up: cosine (to min_lr_ratio * lr) or "
                           "constant.", check=(_schedule, {}), hashed="if_changed")
    plateau_tol: float | None = opt(None, "Stop at a plateau of the held-out loss (see above).",
                                    check=(validate.number, {"above": 0, "below": 1}),
                                    hashed="if_changed")
    min_steps: int = opt(0, "The earliest step the plateau rule may stop at.",
                         hashed="if_changed", check=validate.COUNT0)
    train_chars: int | None = opt(None, "The first N characters of the training split only.",
                                  check=_AT_LEAST_1, hashed="if_changed")

    def __post_init__(self) -> None:
        """The fields' own checks (`blockcoupling.fields`), then the rules between them."""
        check_fields(self, prefix="TinyLMConfig: ", dashes=False)
        if self.n_embd % self.n_head:
            raise BlockCouplingError(
                f"TinyLMConfig: n_embd={self.n_embd} must be a multiple of n_head={self.n_head}"
            )
        if not self.checkpoints:
            raise BlockCouplingError("TinyLMConfig: give max_steps >= 0 and at least one checkpoint")
        if list(self.checkpoints) != sorted(set(self.checkpoints)) or not all(
            0 <= s <= self.max_steps for s in self.checkpoints
        ):
            raise BlockCouplingError(
                f"TinyLMConfig: checkpoints={self.checkpoints} must be increasing, distinct and "
                f"within 0..max_steps={self.max_steps}"
            )
        if self.plateau_tol is not None:
            if tuple(self.checkpoints) != doubling_checkpoints(self.max_steps):
                raise BlockCouplingError(
                    "TinyLMConfig: with plateau_tol the checkpoints must be step 0 and the powers "
                    f"of two up to max_steps (a power of two), not {self.checkpoints}")
            if not 2 <= self.min_steps <= self.max_steps:
                raise BlockCouplingError(
                    f"TinyLMConfig: min_steps={self.min_steps} must be in 2..max_steps="
                    f"{self.max_steps} (the plateau rule compares step s with s/2)")

    @classmethod
    def quick(cls) -> TinyLMConfig:
        """A very small version for tests and ``--quick``: 2 layers, d = 32, 20 steps."""
        return cls(
            n_layer=2, n_embd=32, n_head=2, block_size=32, batch_size=8, max_steps=20,
            checkpoints=(0, 20), warmup_steps=2, val_windows=4,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["checkpoints"] = list(self.checkpoints)
        return d

    def cache_key(self) -> str:
        """16 hex digits of the SHA-256 of the config, the corpus and the cache format. The
        fields added after caches were made (``hashed="if_changed"``) enter only where they
        differ from their defaults, so a config that does not use them keeps its key (and
        its cache)."""
        payload = {
            "config": identity(self, self.to_dict()),
            "corpus_sha256": corpus_sha256(),
            "format": CACHE_FORMAT,
        }
        return canonical_hash(payload, digits=16, compact=False, strict=False)


def doubling_checkpoints(max_steps: int) -> tuple[int, ...]:
    """Step 0 and the powers of two up to ``max_steps`` (which must be one): the checkpoints
    of a run that may stop at a plateau (log-spaced; each step's half is one of them)."""
    if max_steps < 1 or max_steps & (max_steps - 1):
        raise BlockCouplingError(f"max_steps must be a power of two (the plateau rule checks "
                                 f"each doubling), not {max_steps}")
    return (0, *(2 ** i for i in range(max_steps.bit_length())))


def plateau_check(losses: dict[int, float], step: int, tol: float) -> dict[str, Any]:
    """The plateau criterion at ``step``: the relative improvement of the held-out loss over
    the last doubling, ``(L(step/2) - L(step)) / L(step/2)``, below ``tol``."""
    half = step // 2
    rel = (losses[half] - losses[step]) / losses[half]
    return {"criterion": f"relative improvement of the held-out loss from step {half} to step "
                         f"{step} below {tol:g}", "step": step, "half": half,
            "rel_improvement": float(rel), "reached": bool(rel < tol)}


# ----------------------------------------------------------------------------------------------
# Corpus and tokenizer
# ----------------------------------------------------------------------------------------------

# Typographic characters mapped to ASCII so that the character vocabulary stays small.
_ASCII_MAP = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
        "\u2014": "-", "\u2026": "...", "\u00a0": " ", "\u00df": "ss", "\u00b0": " degrees",
    }
)
_UNDERLINE = re.compile(r"^\s*([*=\-~^#])\1{2,}\s*$")  # reST heading underlines
_KEEP = re.compile(r"[^\x20-\x7e\n]")  # anything not printable ASCII or newline


def _clean(text: str) -> str:
    """ASCII-fold, drop reST underline lines, strip trailing spaces, squeeze blank lines."""
    text = unicodedata.normalize("NFKC", text).translate(_ASCII_MAP).replace("\t", "    ")
    text = _KEEP.sub("", text)
    lines = [line.rstrip() for line in text.split("\n") if not _UNDERLINE.match(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


@functools.lru_cache(maxsize=1)
def _corpus_documents() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    return tuple(_clean(topics[key]) for key in sorted(topics))


def corpus_documents() -> list[str]:
    """The cleaned pydoc help topics, one string per topic, sorted by topic key.

    The texts ship with CPython (``pydoc_data.topics``) so no download is needed; they differ
    slightly between Python versions, which is why the cache key includes their hash.
    """
    return list(_corpus_documents())


def corpus_text() -> str:
    """All topics, cleaned, in sorted-key order, separated by blank lines (deterministic)."""
    return "\n\n\n".join(corpus_documents())


def corpus_sha256() -> str:
    return hashlib.sha256(corpus_text().encode()).hexdigest()


def build_tokenizer(text: str) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over the characters of ``text`` (sorted), plus pad and unk.

    Built from a ``tokenizers`` word-level model whose "words" are single characters, so it
    saves with ``save_pretrained``, reloads with ``AutoTokenizer.from_pretrained`` and is
    callable as ``tokenizer(texts, return_tensors="pt", padding=True)``. Decoding fuses the
    characters back, so ``decode(encode(s)) == s`` for any ``s`` over the vocabulary.
    Id 0 is ``[PAD]``, id 1 ``[UNK]``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(text))
    vocab = {PAD_TOKEN: 0, UNK_TOKEN: 1}
    for c in chars:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        padding_side="right",
    )


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> torch.Tensor:
    """All of ``text`` as one long id vector (no special tokens, no length limit).   # (N,)"""
    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    return torch.tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$BLOCKCOUPLING_CACHE/demo``, else ``$XDG_CACHE_HOME/blockcoupling/demo``, else
    ``~/.cache/blockcoupling/demo``."""
    if os.environ.get("BLOCKCOUPLING_CACHE"):
        return Path(os.environ["BLOCKCOUPLING_CACHE"]).expanduser() / "demo"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "blockcoupling" / "demo"


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def _lr_at(cfg: TinyLMConfig, step: int) -> float:
    """Linear warm-up, then constant or cosine decay to ``min_lr_ratio * lr`` (``lr_at``)."""
    floor = cfg.lr if cfg.lr_schedule == "constant" else cfg.min_lr_ratio * cfg.lr
    return lr_at(step, cfg.max_steps, cfg.warmup_steps, cfg.lr, floor)


def gpt2_config(cfg: TinyLMConfig, vocab_size: int, pad_id: int) -> Any:
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=cfg.block_size,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=pad_id,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=True,
    )


@contextmanager
def _deterministic() -> Iterator[None]:
    """Turn on ``torch.use_deterministic_algorithms`` for the block, restoring it afterwards."""
    was = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _windows(ids: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """Rows ``ids[s : s + length]`` for each start.   # (B,) -> (B, length)"""
    return ids[starts[:, None] + torch.arange(length)[None, :]]


def held_out_text(cfg: TinyLMConfig) -> str:
    """The validation split: every ``val_every``-th pydoc topic (sorted by key)."""
    docs = corpus_documents()
    return "\n\n\n".join(d for i, d in enumerate(docs) if i % cfg.val_every == cfg.val_every - 1)


def validation_chunk(cfg: TinyLMConfig, val_ids: torch.Tensor) -> torch.Tensor:
    """The held-out windows of ``block_size + 1`` tokens the validation loss is taken on:
    ``val_windows`` evenly spaced ones, or with ``val_windows=0`` the whole split in windows
    that overlap by one token (every held-out token after the first is predicted once).
    # (M,) -> (W, block_size + 1)"""
    span, t = cfg.block_size + 1, cfg.block_size
    if cfg.val_windows == 0:
        starts = torch.arange(0, len(val_ids) - span + 1, t)  # (W,)
    else:
        starts = torch.linspace(0, len(val_ids) - span, cfg.val_windows).long()  # (W,)
    return _windows(val_ids, starts, span)


def held_out_scores(model: torch.nn.Module, chunk: torch.Tensor) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) and top-1 accuracy (percent) of ``model`` on
    ``chunk`` (W, T+1), in one forward pass without gradients."""
    with torch.no_grad():
        logits = model(input_ids=chunk[:, :-1]).logits  # (W, T, V)
    target = chunk[:, 1:]  # (W, T)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    acc = (logits.argmax(-1) == target).double().mean()
    return {"val_loss": float(loss), "accuracy": 100.0 * float(acc),
            "n_eval_tokens": int(target.numel())}


def _lm_loss(model: torch.nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``chunk`` (B, T+1): inputs [:, :-1], targets [:, 1:]."""
    logits = model(input_ids=chunk[:, :-1]).logits  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))


def tiny_lm_prompts(cfg: TinyLMConfig, quick: bool = False) -> list[str]:
    """The corpus prompts the tiny LM is measured on (by the monitor: all of them; by the
    demo's sweep: the first with ``quick``), each cut to the model's context (one character
    is one token)."""
    prompts = [p[: cfg.block_size] for p in _CORPUS_PROMPTS]
    return prompts[:1] if quick else prompts


def monitor_options(cfg: TinyLMConfig) -> dict[str, Any]:
    """What the training-time monitor measures at each checkpoint step: depth-wise coupling at
    one K (10, or d/10 where that is smaller: a K the demo's sweep measures too, quick or not)
    at the last token of the corpus prompts. Cheap: one Jacobian per block and prompt; the
    full measurement is the sweep's, on the saved checkpoints."""
    return {"coupling": ("depth",), "k": _k_values(cfg.n_embd, quick=True), "tokens": "last"}


def _train_and_save(cfg: TinyLMConfig, target: Path, progress: bool,
                    monitor: bool = True) -> dict[str, Any]:
    """Train the tiny LM from scratch, save ``target/step-NNNNNN/`` (model + tokenizer) at each
    step of ``cfg.checkpoints``, return the log (``train_loss`` per step, before the update;
    ``checkpoints``: step -> held-out scores). ``monitor``: a `CouplingMonitor` measures
    each checkpoint in the loop into ``target/monitor`` (training is the same without it)."""
    from transformers import GPT2LMHeadModel

    from blockcoupling.progress import bar as progress_bar
    from blockcoupling.studies.monitor import CouplingMonitor

    tokenizer, train_ids, val_ids = _training_data(cfg)
    val_chunk = validation_chunk(cfg, val_ids)  # (W, span)
    log: dict[str, Any] = {
        "config": cfg.to_dict(), "cache_key": cfg.cache_key(), "corpus_sha256": corpus_sha256(),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "n_train_tokens": len(train_ids), "n_val_tokens": len(val_ids),
        "vocab_size": len(tokenizer), "train_loss": [], "checkpoints": {}}
    data_gen = torch.Generator().manual_seed(cfg.seed + 1)  # fixed data order

    with torch.random.fork_rng(devices=[]), _deterministic(), contextlib.ExitStack() as stack:
        torch.manual_seed(cfg.seed)
        model = GPT2LMHeadModel(gpt2_config(cfg, len(tokenizer), tokenizer.pad_token_id))
        log["n_params"] = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(  # weight decay on the matrices only
            [{"params": [p for p in model.parameters() if p.dim() >= 2],
              "weight_decay": cfg.weight_decay},
             {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
        mon = stack.enter_context(CouplingMonitor(  # released however training ends
            tokenizer, tiny_lm_prompts(cfg), every=None, steps=cfg.checkpoints,
            out=target / MONITOR_DIR, label="tiny LM", **monitor_options(cfg))) if monitor else None
        bar = stack.enter_context(progress_bar(total=cfg.max_steps, desc="training tiny LM",
                                               unit="step", leave=False, enabled=progress))
        t0, monitor_s, last_loss = time.perf_counter(), 0.0, float("nan")
        for step in range(cfg.max_steps + 1):
            if mon is not None:  # measures the checkpoint steps only (steps=cfg.checkpoints)
                t_mon = time.perf_counter()
                mon.step(model, step)
                monitor_s += time.perf_counter() - t_mon
            if step in cfg.checkpoints and _checkpoint(cfg, model, tokenizer, step, target,
                                                       val_chunk, last_loss, log):
                break  # the held-out loss plateaued
            if step == cfg.max_steps:
                break
            last_loss = _train_step(cfg, model, opt, step, train_ids, data_gen)
            log["train_loss"].append(last_loss)
            bar.update(1)
            bar.set_postfix(loss=f"{last_loss:.3f}")
    return _ended(log, step, time.perf_counter() - t0, monitor_s if monitor else None)


def _ended(log: dict[str, Any], step: int, seconds: float,
           monitor_seconds: float | None) -> dict[str, Any]:
    """``log`` with the training's seconds (and the monitor's), where it ended (``max_steps``,
    or where the plateau rule stopped), the mean training loss over its last 10 % of steps
    (one batch is noisy) and the held-out loss there."""
    log["seconds"] = seconds
    log["monitor_seconds"] = monitor_seconds
    log["end_step"] = step
    tail = log["train_loss"][-max(1, step // 10):]
    log["final_train_loss"] = sum(tail) / len(tail) if tail else None
    log["final_val_loss"] = log["checkpoints"][str(step)]["val_loss"]
    return log


def _training_data(cfg: TinyLMConfig
                   ) -> tuple[PreTrainedTokenizerFast, torch.Tensor, torch.Tensor]:
    """The character tokenizer of the corpus and the token ids (N,), (M,) of the training
    split (its first ``train_chars`` characters) and of the held-out split."""
    docs = corpus_documents()
    tokenizer = build_tokenizer("\n\n\n".join(docs))
    tokenizer.model_max_length = cfg.block_size
    train_text = "\n\n\n".join(d for i, d in enumerate(docs) if i % cfg.val_every != cfg.val_every - 1)
    train_ids = _encode(tokenizer, train_text)
    val_ids = _encode(tokenizer, held_out_text(cfg))
    if cfg.train_chars is not None:
        train_ids = train_ids[: cfg.train_chars]  # one character is one token
    if len(train_ids) <= cfg.block_size + 1 or len(val_ids) <= cfg.block_size + 1:
        raise BlockCouplingError(
            f"TinyLMConfig: block_size={cfg.block_size} is too long for the corpus (or "
            "train_chars too small); lower it"
        )
    return tokenizer, train_ids, val_ids


def _train_step(cfg: TinyLMConfig, model: torch.nn.Module, opt: torch.optim.Optimizer,
                step: int, train_ids: torch.Tensor, data_gen: torch.Generator) -> float:
    """One optimiser step at the schedule's learning rate on ``batch_size`` windows of the
    training split drawn from ``data_gen`` (the fixed data order); the batch's loss."""
    for group in opt.param_groups:
        group["lr"] = _lr_at(cfg, step)
    span = cfg.block_size + 1
    starts = torch.randint(0, len(train_ids) - span, (cfg.batch_size,), generator=data_gen)
    loss = _lm_loss(model, _windows(train_ids, starts, span))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return float(loss.detach())


def _checkpoint(cfg: TinyLMConfig, model: torch.nn.Module, tokenizer: Any, step: int,
                target: Path, val_chunk: torch.Tensor, last_loss: float,
                log: dict[str, Any]) -> bool:
    """Score the model on the held-out windows, save it as checkpoint ``step`` and log both;
    whether the plateau rule stops training here (`plateau_check`, from ``min_steps`` on)."""
    model.eval()
    val = held_out_scores(model, val_chunk)
    model.train()
    save_model(model, target / checkpoint_name(step), tokenizer)
    log["checkpoints"][str(step)] = {
        "val_loss": val["val_loss"], "val_accuracy": val["accuracy"],
        "train_loss": None if step == 0 else last_loss,
    }
    if cfg.plateau_tol is None or step < cfg.min_steps:
        return False
    losses = {int(k): v["val_loss"] for k, v in log["checkpoints"].items()}
    log["plateau"] = plateau_check(losses, step, cfg.plateau_tol)
    return bool(log["plateau"]["reached"])


def tiny_lm_dir(cfg: TinyLMConfig, cache_dir: str | Path | None = None) -> Path:
    """The cache folder of one training config: ``<cache_dir>/<cfg.cache_key()>``."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / cfg.cache_key()


#: what a reader of a damaged cache is told
_CACHE_HINT = "Run the same command again: it trains that run again into its cache."


def training_log(cfg: TinyLMConfig, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """The saved training log (losses, timings) of a trained config, verified against the
    cache's checksums (`cache_problem`); raises if not trained or damaged."""
    target = tiny_lm_dir(cfg, cache_dir)
    path = target / "training.json"
    if not path.is_file() and not _ledger(target).exists():
        raise BlockCouplingError(
            f"No trained tiny LM at {path.parent}; run train_tiny_lm(cfg) (or `blockcoupling demo`) first"
        )
    problem = cache_problem(target, only=("training.json",))
    if problem is not None:
        raise BlockCouplingError(f"the tiny-LM cache {target} is damaged ({problem}); run the "
                                 "same command again: it trains that run again")
    data: dict[str, Any] = _ledger(target).json("training.json")
    return data


#: the sealed list of a training cache's files and their sha256 (``store.verified.Ledger``),
#: written last (it marks the cache complete); the monitor's collection (``monitor/``) is
#: verified as a collection
CHECKSUMS = "checksums.json"
_CHECKSUMS_FORMAT = "blockcoupling-tiny-lm-cache"


def _ledger(folder: Path) -> Any:
    from blockcoupling.store.verified import Ledger

    return Ledger(folder, _CACHE_HINT, fmt=_CHECKSUMS_FORMAT, name=CHECKSUMS)


def _cache_files(folder: Path) -> list[Path]:
    """The files a cache's checksums cover: everything but the monitor and the list itself."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS
                  and p.relative_to(folder).parts[0] != MONITOR_DIR)


def _write_checksums(folder: Path) -> None:
    """Seal the cache in ``folder``: every file's sha256 (its `CHECKSUMS` ledger)."""
    _ledger(folder).seal(p.relative_to(folder).as_posix() for p in _cache_files(folder))


def _checksums(target: Path) -> tuple[dict[str, str] | None, str | None]:
    """(file -> sha256, None) of a sealed cache, or (None, why it cannot be trusted)."""
    ledger = _ledger(target)
    if not ledger.exists():
        if (target / "training.json").is_file():
            return None, (f"{ledger.path} is missing: it has no checksums (written by an "
                          "older blockcoupling, or deleted)")
        return None, "its training did not finish"
    problem = ledger.problem()
    if problem is not None:
        return None, problem
    return ledger.entries(), None


def cache_problem(target: Path, only: tuple[str, ...] | None = None) -> str | None:
    """Why the training cache in ``target`` cannot be reused, or None: its checksums are
    missing, unsealed or edited, or a file is missing, altered or not listed (``only``: check
    just these files). A cache written before checksums has none: trained again."""
    files, problem = _checksums(target)
    if files is None:
        return problem
    problem = _ledger(target).check(only)
    if problem is not None or only is not None:
        return problem
    extra = [p.relative_to(target).as_posix() for p in _cache_files(target)
             if p.relative_to(target).as_posix() not in files]
    if extra:
        return f"{extra[0]} was added after the training"
    return None


def cache_digest(cfg: TinyLMConfig, cache_dir: str | Path | None = None) -> str:
    """The content of a trained config's checkpoints (a digest of their files' checksums):
    equal for bit-identical weights, whatever the timings in its log. A study compares it
    with the digest its sweep measured, to measure again what was trained again."""
    from blockcoupling.hashing import canonical_hash

    files, problem = _checksums(tiny_lm_dir(cfg, cache_dir))
    if files is None:
        raise BlockCouplingError(f"the tiny-LM cache of {cfg.cache_key()} cannot be read: "
                                 f"{problem}")
    return canonical_hash({k: v for k, v in files.items() if k.startswith("step-")}, digits=16)


def _monitor_is_current(cfg: TinyLMConfig, target: Path) -> bool:
    """Whether ``target/monitor`` holds what `monitor_options` and
    `tiny_lm_prompts` ask for today, every checkpoint step done (else the cache is
    retrained: the monitor only measures inside the training loop)."""
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.store import collection as store
    from blockcoupling.studies.monitor import prompt_items

    root = target / MONITOR_DIR
    if not store.is_sweep_dir(root):
        return False
    try:
        spec = (store.load_manifest(root).get("spec") or {}).get("monitor") or {}
        units = store.catalogue(root)
    except (OSError, ValueError, BlockCouplingError):
        return False
    config = MeasureConfig().replace(**monitor_options(cfg))
    want = {"prompt_set": prompt_items(tiny_lm_prompts(cfg), None, config.seed)[1],
            "steps": sorted(cfg.checkpoints),
            "config": json.loads(json.dumps(config.to_dict(), default=str))}
    done = sorted(int(x) for x in units.loc[units["status"] == "done", "step"])
    return all(spec.get(k) == v for k, v in want.items()) and done == sorted(cfg.checkpoints)


def train_tiny_lm(
    cfg: TinyLMConfig, cache_dir: str | Path | None = None, progress: bool = True,
    monitor: bool = True,
) -> list[tuple[int, Path]]:
    """Train (or reuse) the tiny LM; return ``(step, checkpoint folder)`` for each checkpoint.

    Checkpoints live in ``<cache_dir>/<cfg.cache_key()>/step-NNNNNN`` (``cache_dir`` defaults
    to `default_cache_dir`), each with its tokenizer, so ``AutoModel.from_pretrained`` and
    ``AutoTokenizer.from_pretrained`` load it. With ``monitor`` (the demo's tiny LM) the model
    is trained with a `blockcoupling.CouplingMonitor` into ``monitor/``
    (`monitor_dir`); a cache without a current monitor directory is then trained again
    (the weights come out bit-identical). ``training.json`` (losses, timings) and then the
    sealed checksums of every file (`CHECKSUMS`) are written last; a folder whose files
    all match them is complete and is reused without training, and a damaged one (a file
    missing, altered, truncated or added; checksums missing, as in caches of an older
    blockcoupling) is trained again, with a warning. Training goes to a temporary sibling
    folder that is renamed into place, so an interrupted run leaves no half-written cache; a
    full or read-only disk is one `BlockCouplingError`. A run with ``plateau_tol`` returns the checkpoints up to the step it
    stopped at (``end_step`` of `training_log`); it cannot have the monitor (which
    expects every checkpoint step).
    """
    if monitor and cfg.plateau_tol is not None:
        raise BlockCouplingError("train_tiny_lm: a run that stops at a plateau is trained with "
                                 "monitor=False (the monitor expects every checkpoint step)")
    target = tiny_lm_dir(cfg, cache_dir)

    def complete() -> bool:
        return cache_problem(target) is None and (
            not monitor or _monitor_is_current(cfg, target))

    if not complete():
        if target.exists() and (problem := cache_problem(target)) is not None:
            warnings.warn(f"the tiny-LM cache {target} cannot be reused ({problem}): training "
                          "it again", UserWarning, stacklevel=2)
        try:
            _train_into(cfg, target, progress, monitor, complete)
        except OSError as err:
            raise BlockCouplingError(_cache_write_error(err, target)) from err
    end = _ledger(target).json("training.json").get("end_step", cfg.max_steps)
    out = [(s, target / checkpoint_name(s)) for s in cfg.checkpoints if s <= end]
    missing = [str(p) for _, p in out if not (p / "config.json").is_file()]
    if missing:
        raise BlockCouplingError(
            f"The tiny-LM cache {target} is incomplete (missing {missing[0]}); delete that "
            "folder and run again"
        )
    return out


def _train_into(cfg: TinyLMConfig, target: Path, progress: bool, monitor: bool,
                complete: Any) -> None:
    """Train into a temporary sibling of ``target``, seal it (`CHECKSUMS`, last) and
    rename it into place; a failure leaves ``target`` as it was and removes the sibling."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f"{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        log = _train_and_save(cfg, tmp, progress, monitor=monitor)
        (tmp / "training.json").write_text(dumps(log))  # the one JSON dialect
        _write_checksums(tmp)
        if target.exists():  # an incomplete, damaged or outdated folder, or a racing run's
            if complete():
                shutil.rmtree(tmp)
            else:
                shutil.rmtree(target)
                os.replace(tmp, target)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cache_write_error(err: OSError, target: Path) -> str:
    """One line for an operating-system error while training into the cache."""
    from blockcoupling.loading import WRITE_ERRNOS

    where = err.filename or target.parent
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"no space left on the device while writing the training cache ({where}); "
                "free some space and run the same command again: finished trainings are kept, "
                "the interrupted one is trained again from its start")
    if err.errno in WRITE_ERRNOS:
        return (f"cannot write the training cache {where} ({err.strerror}); set "
                "BLOCKCOUPLING_CACHE to a writable folder (or fix the folder's permissions) "
                "and run the same command again")
    return f"cannot write the training cache {where} ({err.strerror or err}); check the disk"


def monitor_dir(cfg: TinyLMConfig, cache_dir: str | Path | None = None) -> Path:
    """The monitor directory written while ``cfg`` was trained with ``monitor=True`` (one unit
    per checkpoint step: `monitor_options`, `tiny_lm_prompts`)."""
    return tiny_lm_dir(cfg, cache_dir) / MONITOR_DIR


def check_checkpoint(path: str | Path) -> None:
    """Verify a checkpoint folder of a tiny-LM cache against the cache's checksums (one line
    naming a missing or altered file and the command that trains it again); a folder outside
    a cache (no checksums beside it) is the caller's own model."""
    folder = Path(path)
    ledger = _ledger(folder.parent)
    if not ledger.exists():
        return
    mine = [n for n in ledger.entries() if n.startswith(f"{folder.name}/")]
    if not mine:
        raise BlockCouplingError(f"{folder} is not a checkpoint of the tiny-LM cache "
                                 f"{folder.parent}. {_CACHE_HINT}")
    for name in mine:
        ledger.read(name)


def load_checkpoint(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A trained tiny-LM checkpoint as a base ``GPT2Model`` (no LM head) in eval mode, and its
    tokenizer, checked first (`check_checkpoint`)."""
    from transformers import AutoModel, AutoTokenizer

    check_checkpoint(path)

    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer



__all__ = [
    "CACHE_FORMAT",
    "CHECKSUMS",
    "MONITOR_DIR",
    "TinyLMConfig",
    "build_tokenizer",
    "cache_digest",
    "cache_problem",
    "check_checkpoint",
    "checkpoint_name",
    "corpus_documents",
    "corpus_sha256",
    "corpus_text",
    "default_cache_dir",
    "doubling_checkpoints",
    "held_out_scores",
    "held_out_text",
    "load_checkpoint",
    "monitor_dir",
    "monitor_options",
    "plateau_check",
    "tiny_lm_dir",
    "tiny_lm_prompts",
    "train_tiny_lm",
    "training_log",
    "validation_chunk",
]
