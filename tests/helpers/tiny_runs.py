"""Helpers of the fault and bad-input suites: a tiny model folder as a user has one, the CLI
run in-process, and run directories compared bit for bit."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from blockcoupling.cli import app
from blockcoupling.engine.results import TABLES
from blockcoupling.store import open_run

WORDS = "the a cat dog sat on mat ran far what is capital of france".split()
PROMPTS = ["the cat sat on the mat", "what is the capital of france", "a dog ran far",
           "the dog sat on a mat"]

# the ViT study's tiny settings (width 16, 2 blocks, 8x8 images: 4 patches + [CLS])
TINY_VIT = dict(preset="tiny", hidden_size=16, depth=2, heads=2, image_size=8, train_limit=96,
            test_limit=32, batch_size=32, k=2, monitor_images=2, final_images=2)


def save_tiny_lm(path: Path, *, tokenizer: bool = True, head: bool = False) -> Path:
    """A tiny random GPT-2 (3 blocks, d=16, context 32) with a word-level tokenizer, saved as
    a hub model folder; ``head``: saved as a causal LM with an untied ``lm_head`` (Llama)."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.helpers.tiny_models import tiny_model

    if head:
        cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=16, intermediate_size=32,
                             num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                             max_position_embeddings=32, tie_word_embeddings=False)
        tf.LlamaForCausalLM(cfg).save_pretrained(path)
    else:
        tiny_model("gpt2").save_pretrained(path)
    if tokenizer:
        vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *WORDS])}
        tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tk.pre_tokenizer = pre_tokenizers.Whitespace()
        tok = tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")
        tok.save_pretrained(path)
    return path


RATINGS = [0.12, 0.85, 0.4, 0.63, 0.27, 0.91, 0.05, 0.5]


def e2h_arc_rows(path: Path) -> Path:
    """Rows shaped like Easy2Hard-Bench's E2H-ARC (its dataset card's columns)."""
    rng = np.random.default_rng(0)
    rows = []
    for i, r in enumerate(RATINGS):
        q = " ".join(rng.choice(WORDS, size=3 + i % 5))
        rows.append({"rating": r, "rating_std": 0.1, "rating_quantile": r, "id": f"Mercury_{i}",
                     "question": q, "choices": {"label": ["A", "B"], "text": ["cat", "dog"]},
                     "answerKey": "A", "model_avg_acc": 1 - r, "unnorm_rating": 3 * r,
                     "unnorm_rating_std": 0.3})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_prompts(path: Path, prompts: list[str] = PROMPTS) -> Path:
    path.write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
    return path


def cli(*args: str) -> object:
    """Run the CLI in this process; exceptions are caught (a traceback would show in output)."""
    return CliRunner().invoke(app, list(args), catch_exceptions=True)


def cli_parser() -> Callable[..., object]:
    """`cli` with the click commands built once (building them is most of an invocation's
    time; the tests that feed every option and every spec key run hundreds)."""
    from unittest import mock

    import typer

    group = typer.main.get_command(app)

    def run(*args: str) -> object:
        with mock.patch("typer.testing._get_command", lambda _: group):
            return CliRunner().invoke(app, list(args), catch_exceptions=True)

    return run


def measure_rated(root: Path) -> tuple[Path, Path]:
    """(run, rows): a tiny LM measured on 6 of the 8 `e2h_arc_rows` (``hf:e2h-arc@rows``)."""
    rows = e2h_arc_rows(root / "e2h_arc.jsonl")
    model = save_tiny_lm(root / "m")
    r = cli("-q", "measure", "--model", str(model), "--prompts", f"hf:e2h-arc@{rows}",
            "--limit", "6", "--k", "2", "--out", str(root / "run"))
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    return root / "run", rows


def assert_user_error(r: object, *expected: str, code: int = 1) -> str:
    """Exit ``code`` (1: a user error; 2: bad usage, an option or a spec key refused), no
    traceback, exactly one line ``error: ...`` holding every ``expected`` piece
    (case-insensitive)."""
    output = r.output  # type: ignore[attr-defined]
    assert "Traceback" not in output, output
    exc = r.exception  # type: ignore[attr-defined]
    assert exc is None or isinstance(exc, SystemExit), repr(exc)
    assert r.exit_code == code, output  # type: ignore[attr-defined]
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    text = output.lower()
    for piece in expected:
        assert piece.lower() in text, (piece, output)
    return output


TIMINGS = {"diagnostics": ["seconds"]}  # wall-clock columns: the only ones that may differ


def assert_identical_runs(got_dir: Path, want_dir: Path) -> None:
    """Every table equal to the bit (values, dtypes, row order) and every array equal."""
    got, want = open_run(got_dir), open_run(want_dir)
    for name in TABLES:
        drop = TIMINGS.get(name, [])
        pd.testing.assert_frame_equal(got.table(name).drop(columns=drop),
                                      want.table(name).drop(columns=drop), check_exact=True,
                                      obj=f"table {name}")
    assert sorted(got.arrays) == sorted(want.arrays), "arrays.npz holds other arrays"
    for key, value in want.arrays.items():
        assert got.arrays[key].dtype == value.dtype
        np.testing.assert_array_equal(got.arrays[key], value, err_msg=key)
    assert got.config == want.config


def assert_clean_finished(run_dir: Path) -> None:
    """A finished run: complete, no lock, no parts, no temporary files, no duplicate rows."""
    m = open_run(run_dir)
    assert m.meta["status"] == "complete"
    assert not (run_dir / ".lock").exists(), "a finished run keeps its .lock"
    assert not (run_dir / "parts").exists()
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".tmp-")]
    assert not m.prompts["prompt_id"].duplicated().any()
    key = [c for c in m.coupling.columns if c != "value"]
    assert not m.coupling.duplicated(subset=key).any()


# ---------------------------------------------------------------------------- fault probes
# Named points of a run where a fault can be injected. Each is observed through a public hook
# or a standard-library / torch function the run calls there, never a private name:
#   capture      the start of a batch's forward pass (forward pre-hook on the base model)
#   block        any block call: the capture's, and the Jacobians' replays of a block
#   jacobian     a top-K SVD of a Jacobian (torch.linalg.svd)
#   part_write   a file of a part being written (fsync under parts/.tmp-part-*)
#   part_commit  the rename that commits a part (os.replace of parts/.tmp-part-*)
#   manifest     the manifest written (at the start, on resume, and the finalize commit)
#   consolidate  a consolidated file written to its temporary name or renamed into place
POINTS = ("capture", "block", "jacobian", "part_write", "part_commit", "manifest", "consolidate")
KILL_POINTS = ("capture", "jacobian", "part_write", "part_commit", "manifest", "consolidate")


def install_probes(trip: Callable[[str], None]) -> Callable[[], None]:
    """Call ``trip(point)`` at every occurrence of each point; returns an uninstaller."""
    import os

    import torch

    real_fsync, real_replace, real_svd = os.fsync, os.replace, torch.linalg.svd

    def pre_hook(module: torch.nn.Module, args: object) -> None:
        name = type(module).__name__
        if name == "GPT2Model":
            trip("capture")
        elif name == "GPT2Block":
            trip("block")

    def fsync(fd: int) -> None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if "/parts/.tmp-part-" in target:
            trip("part_write")
        elif "/.tmp-manifest.json" in target:
            trip("manifest")
        elif "/.tmp-" in target and "/parts/" not in target:
            trip("consolidate")
        real_fsync(fd)

    def replace(src: object, dst: object, *a: object, **k: object) -> None:
        s = str(src)
        if "/parts/.tmp-part-" in s:
            trip("part_commit")
        elif "/.tmp-manifest.json" in s:
            trip("manifest")
        elif "/.tmp-" in s and "/parts/" not in s:
            trip("consolidate")
        real_replace(src, dst, *a, **k)

    def svd(*a: object, **k: object) -> object:
        trip("jacobian")
        return real_svd(*a, **k)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    os.fsync, os.replace, torch.linalg.svd = fsync, replace, svd

    def uninstall() -> None:
        handle.remove()
        os.fsync, os.replace, torch.linalg.svd = real_fsync, real_replace, real_svd

    return uninstall
