"""Tests of the offline demo's model side: corpus, tokenizer, tiny-LM training and cache,
MiniLM loading and its random twin, and the orchestration of ``run_demo``."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies import demo, tiny_lm

# Small enough to train 30 steps in about a second on one core.
SMALL = tiny_lm.TinyLMConfig(
    n_layer=2, n_embd=16, n_head=2, block_size=16, batch_size=4, max_steps=30,
    checkpoints=(0, 10, 30), warmup_steps=2, val_windows=4, lr=1e-2,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, Path]]]:
    root = tmp_path_factory.mktemp("demo-cache")
    return root, tiny_lm.train_tiny_lm(SMALL, root, progress=False)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tiny_lm.build_tokenizer(tiny_lm.corpus_text())


def _state(path: Path) -> dict[str, torch.Tensor]:
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(path).state_dict()


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------


def test_clean_folds_typography_and_drops_underlines() -> None:
    raw = "Title\n*****\n\n\n\nUse \u201cif\u201d \u2014 it\u2019s fine\u2026   \n\tx = 1\n===\n"
    assert tiny_lm._clean(raw) == "Title\n\nUse \"if\" - it's fine...\n    x = 1"


def test_corpus_is_deterministic_ascii_and_complete() -> None:
    from pydoc_data.topics import topics

    first = tiny_lm.corpus_text()
    tiny_lm._corpus_documents.cache_clear()
    second = tiny_lm.corpus_text()
    assert first == second
    docs = tiny_lm.corpus_documents()
    assert len(docs) == len(topics)
    assert docs[0] == tiny_lm._clean(topics[sorted(topics)[0]])
    assert all(c == "\n" or 0x20 <= ord(c) <= 0x7E for c in set(first))
    assert 'The "if" statement' in first
    assert not any(set(line.strip()) == {"*"} for line in first.split("\n"))
    assert tiny_lm.corpus_sha256() == tiny_lm.corpus_sha256()


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


def test_tokenizer_ids_follow_sorted_characters(tokenizer: Any) -> None:
    chars = sorted(set(tiny_lm.corpus_text()))
    assert len(tokenizer) == len(chars) + 2
    assert tokenizer.pad_token_id == 0 and tokenizer.unk_token_id == 1
    text = "def f(x):\n    return x"
    expected = [chars.index(c) + 2 for c in text]  # independent character -> id map
    assert tokenizer(text)["input_ids"] == expected
    assert tokenizer("a\u00e9b")["input_ids"] == [chars.index("a") + 2, 1, chars.index("b") + 2]


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=sorted(set("abc XYZ\n().,:;\"'019_=+-*/<>{}[]")), max_size=40))
def test_tokenizer_round_trip(tokenizer: Any, text: str) -> None:
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_tokenizer_save_load_and_padded_batch(tokenizer: Any, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    texts = ["The if statement", "x = 1", ""]
    a = tokenizer(texts, return_tensors="pt", padding=True)
    b = loaded(texts, return_tensors="pt", padding=True)
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(a["attention_mask"], b["attention_mask"])
    assert a["input_ids"].shape == (3, 16)
    assert a["attention_mask"].sum(1).tolist() == [16, 5, 0]
    assert (a["input_ids"][1, 5:] == 0).all()  # right padding with [PAD] = 0
    assert loaded.decode(b["input_ids"][1, :5].tolist()) == "x = 1"


# ---------------------------------------------------------------------------------------------
# Config and schedule
# ---------------------------------------------------------------------------------------------


def test_config_validation_and_cache_key() -> None:
    with pytest.raises(BlockCouplingError, match="multiple of n_head"):
        tiny_lm.TinyLMConfig(n_embd=30, n_head=4)
    with pytest.raises(BlockCouplingError, match="increasing"):
        tiny_lm.TinyLMConfig(checkpoints=(0, 50, 25))
    with pytest.raises(BlockCouplingError, match="within"):
        tiny_lm.TinyLMConfig(max_steps=10, checkpoints=(0, 20))
    same = tiny_lm.TinyLMConfig(**{**SMALL.to_dict(), "checkpoints": tuple(SMALL.checkpoints)})
    assert same.cache_key() == SMALL.cache_key()
    other = tiny_lm.TinyLMConfig(**{**SMALL.to_dict(), "checkpoints": (0, 10, 30), "seed": 1})
    assert other.cache_key() != SMALL.cache_key()
    assert len(SMALL.cache_key()) == 16


def test_default_config_is_documented_small_lm() -> None:
    cfg = tiny_lm.TinyLMConfig()
    assert cfg.checkpoints[0] == 0 and cfg.checkpoints[-1] == cfg.max_steps
    assert 4 <= cfg.n_layer <= 6 and 64 <= cfg.n_embd <= 128


def test_lr_schedule_warmup_then_cosine() -> None:
    cfg = tiny_lm.TinyLMConfig(max_steps=100, checkpoints=(0, 100), warmup_steps=10, lr=1.0,
                            min_lr_ratio=0.1)
    assert tiny_lm._lr_at(cfg, 0) == pytest.approx(0.1)
    assert tiny_lm._lr_at(cfg, 9) == pytest.approx(1.0)
    assert tiny_lm._lr_at(cfg, 10) == pytest.approx(1.0)
    mid = 10 + 45  # half-way through the cosine
    assert tiny_lm._lr_at(cfg, mid) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert tiny_lm._lr_at(cfg, 100) == pytest.approx(0.1)


# ---------------------------------------------------------------------------------------------
# Training, checkpoints, cache
# ---------------------------------------------------------------------------------------------


def test_checkpoints_are_loadable(trained: tuple[Path, list[tuple[int, Path]]]) -> None:
    root, ckpts = trained
    assert [s for s, _ in ckpts] == [0, 10, 30]
    key_dir = root / SMALL.cache_key()
    for step, path in ckpts:
        assert path == key_dir / f"step-{step:06d}"
        model, tok = tiny_lm.load_checkpoint(path)
        assert type(model).__name__ == "GPT2Model" and not model.training
        assert model.config.n_layer == SMALL.n_layer and model.config.n_embd == SMALL.n_embd
        batch = tok(["The if", "x"], return_tensors="pt", padding=True)
        out = model(**batch).last_hidden_state
        assert out.shape == (2, 6, SMALL.n_embd) and torch.isfinite(out).all()


def test_step0_is_the_seeded_initialisation(trained: tuple[Path, list[tuple[int, Path]]]) -> None:
    from transformers import GPT2LMHeadModel

    _, ckpts = trained
    tok = tiny_lm.build_tokenizer(tiny_lm.corpus_text())
    torch.manual_seed(SMALL.seed)
    fresh = GPT2LMHeadModel(tiny_lm.gpt2_config(SMALL, len(tok), 0)).state_dict()
    saved = _state(ckpts[0][1])
    for name, value in fresh.items():
        assert torch.equal(saved[name], value), name
    later = _state(ckpts[-1][1])
    assert not torch.equal(later["transformer.h.0.attn.c_attn.weight"],
                           saved["transformer.h.0.attn.c_attn.weight"])


def test_loss_decreases(trained: tuple[Path, list[tuple[int, Path]]]) -> None:
    root, _ = trained
    log = tiny_lm.training_log(SMALL, root)
    vocab = log["vocab_size"]
    val = {int(s): v["val_loss"] for s, v in log["checkpoints"].items()}
    # Untrained: close to the uniform-distribution loss ln(V).
    assert abs(val[0] - math.log(vocab)) < 0.3
    assert val[30] < val[0] - 0.5
    assert len(log["train_loss"]) == SMALL.max_steps
    assert log["final_train_loss"] < log["train_loss"][0] - 0.5
    assert log["checkpoints"]["0"]["train_loss"] is None
    assert log["checkpoints"]["30"]["train_loss"] == log["train_loss"][-1]


def test_training_is_deterministic_and_leaves_global_state(tmp_path: Path) -> None:
    cfg = tiny_lm.TinyLMConfig(**{**SMALL.to_dict(), "max_steps": 4, "checkpoints": (0, 4)})
    torch.manual_seed(1234)
    rng_before = torch.get_rng_state()
    det_before = torch.are_deterministic_algorithms_enabled()
    a = tiny_lm.train_tiny_lm(cfg, tmp_path / "a", progress=False)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert torch.are_deterministic_algorithms_enabled() == det_before
    b = tiny_lm.train_tiny_lm(cfg, tmp_path / "b", progress=False)
    sa, sb = _state(a[-1][1]), _state(b[-1][1])
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    assert not torch.equal(sa["transformer.wte.weight"], _state(a[0][1])["transformer.wte.weight"])
    log_a = json.loads((a[0][1].parent / "training.json").read_text())
    log_b = json.loads((b[0][1].parent / "training.json").read_text())
    assert log_a["train_loss"] == log_b["train_loss"]


def test_cache_is_reused_without_training(
    trained: tuple[Path, list[tuple[int, Path]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, ckpts = trained
    before = _state(ckpts[-1][1])

    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("trained again although the cache is complete")

    monkeypatch.setattr(tiny_lm, "_train_and_save", boom)
    again = tiny_lm.train_tiny_lm(SMALL, root, progress=False)
    assert again == ckpts
    after = _state(again[-1][1])
    assert all(torch.equal(before[n], after[n]) for n in before)
    # A different config is a different cache entry, so it must train (and here: fail).
    with pytest.raises(AssertionError, match="trained again"):
        tiny_lm.train_tiny_lm(tiny_lm.TinyLMConfig(**{**SMALL.to_dict(), "seed": 7}), root,
                           progress=False)
    assert not any(".tmp-" in p.name for p in root.iterdir())


def test_incomplete_cache_is_retrained(tmp_path: Path) -> None:
    cfg = tiny_lm.TinyLMConfig(**{**SMALL.to_dict(), "max_steps": 2, "checkpoints": (0, 2)})
    stale = tiny_lm.tiny_lm_dir(cfg, tmp_path)
    (stale / "step-000000").mkdir(parents=True)  # a crash left a folder without training.json
    ckpts = tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False)
    assert (stale / "training.json").is_file()
    assert all((p / "model.safetensors").is_file() for _, p in ckpts)


def test_training_log_missing_raises(tmp_path: Path) -> None:
    with pytest.raises(BlockCouplingError, match="train_tiny_lm"):
        tiny_lm.training_log(SMALL, tmp_path)


def test_default_cache_dir_respects_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BLOCKCOUPLING_CACHE", str(tmp_path))
    assert tiny_lm.default_cache_dir() == tmp_path / "demo"
    monkeypatch.delenv("BLOCKCOUPLING_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tiny_lm.default_cache_dir() == tmp_path / "xdg" / "blockcoupling" / "demo"


# ---------------------------------------------------------------------------------------------
# MiniLM
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> tuple[Any, Any]:
    return demo.load_minilm()


def test_minilm_loads_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("load_minilm tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    model, tok = demo.load_minilm()
    assert type(model).__name__ == "BertModel"
    assert tok("Paris")["input_ids"][0] == tok.cls_token_id


def test_minilm_is_the_pretrained_model(minilm: tuple[Any, Any]) -> None:
    from safetensors.torch import load_file

    model, tok = minilm
    weights = load_file(str(demo.minilm_dir() / "model.safetensors"))
    for name in ("encoder.layer.3.attention.self.query.weight", "embeddings.word_embeddings.weight"):
        assert torch.equal(model.state_dict()[name], weights[name]), name
    assert type(model).__name__ == "BertModel" and not model.training
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6
    batch = tok([demo.CAPITAL_PROMPT, "Hi"], return_tensors="pt", padding=True)
    assert batch["input_ids"][0, 0].item() == tok.cls_token_id
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    assert out.shape[-1] == 384 and torch.isfinite(out).all()


def test_random_like_same_config_different_weights(minilm: tuple[Any, Any]) -> None:
    model, _ = minilm
    rng_before = torch.get_rng_state()
    r0 = demo.random_like(model, seed=0)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert type(r0) is type(model) and not r0.training
    assert r0.config.to_dict() == model.config.to_dict()
    s, s0 = model.state_dict(), r0.state_dict()
    assert s.keys() == s0.keys()
    assert all(s[n].shape == s0[n].shape for n in s)
    w = "encoder.layer.0.attention.self.query.weight"
    assert not torch.allclose(s[w], s0[w])
    # BERT init: normal(0, initializer_range) weights.
    assert s0[w].std().item() == pytest.approx(model.config.initializer_range, rel=0.05)
    r0_again, r1 = demo.random_like(model, seed=0), demo.random_like(model, seed=1)
    assert torch.equal(r0_again.state_dict()[w], s0[w])
    assert not torch.equal(r1.state_dict()[w], s0[w])


# ---------------------------------------------------------------------------------------------
# Prompts and run_demo
# ---------------------------------------------------------------------------------------------


def test_demo_prompts(tokenizer: Any) -> None:
    general = demo.demo_prompts()
    assert general[0] == "What is the capital of France? The capital is"
    assert 3 <= len(general) <= 6
    corpus = demo.demo_prompts("corpus")
    assert 3 <= len(corpus) <= 6
    for text in corpus:  # in the tiny LM's vocabulary, short
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.unk_token_id not in ids and len(ids) <= 20
    with pytest.raises(BlockCouplingError, match="register"):
        demo.demo_prompts("nonsense")


def test_k_values() -> None:
    assert tiny_lm._k_values(384, quick=False) == (10, 38)
    assert tiny_lm._k_values(128, quick=False) == (10, 13)
    assert tiny_lm._k_values(16, quick=False) == (2, 10)
    assert tiny_lm._k_values(8, quick=True) == (1,)


def test_each_demo_line_names_its_token() -> None:
    """The demo's summary lines say which token each headline measures: MiniLM measured at
    its last token is at [SEP] (not the [CLS] of ``tokens="auto"``, which the README's
    example measures), and the numbers on the line are that run's headline."""
    import blockcoupling as bc
    from tests.helpers.tiny_models import tiny_inputs, tiny_model

    kw: dict[str, Any] = dict(coupling=("depth",), k=(2,), progress=False)
    enc, dec = tiny_model("bert"), tiny_model("gpt2")
    at_last = bc.measure(enc, None, tiny_inputs("bert"), tokens="last", **kw)
    at_cls = bc.measure(enc, None, tiny_inputs("bert"), **kw)  # auto: [CLS] for an encoder
    every = bc.measure(dec, None, tiny_inputs("gpt2"), tokens="all", **kw)
    line = demo.demo_line("MiniLM pretrained", at_last)
    assert "at the last token ([SEP], not [CLS]):" in line
    assert "at the [CLS]:" in demo.demo_line("MiniLM, README's token", at_cls)
    assert demo.token_words(every) == "last token, every token measured"
    assert demo.token_words(bc.measure(dec, None, tiny_inputs("gpt2"), **kw)) == "last token"
    rot = bc.coupling_statistic(at_last, k=2).set_index("variant").loc["coupling_vs_rotated"]
    assert f"{rot['mean']:.4f}" in line


def test_run_demo_call_sites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trained: tuple[Path, list[tuple[int, Path]]]
) -> None:
    """run_demo drives measure_to_dir (MiniLM), a sweep over the tiny LM's checkpoints and
    write_report with the agreed names (fakes stand in for the measurement and the sweep)."""
    import pandas as pd

    from blockcoupling.studies import sweep as sweep_pkg

    calls: list[dict[str, Any]] = []

    def measure_to_dir(model, tokenizer, prompts, out_dir, *, meta, prompts_spec, resume=False,  # type: ignore[no-untyped-def]
                       progress=True, **kw):
        assert resume is True and progress is False
        batch = tokenizer(list(prompts), return_tensors="pt", padding=True)
        assert set(batch) >= {"input_ids", "attention_mask"}
        calls.append({"model": model, "prompts": list(prompts), "out_dir": Path(out_dir),
                      "meta": meta, "spec": prompts_spec, "kw": kw})
        return types.SimpleNamespace(meta=meta, name=f"measurement-{len(calls)}")

    sweeps: list[dict[str, Any]] = []
    root, ckpts = trained

    def run_sweep(spec, out, *, executor, resume, progress):  # type: ignore[no-untyped-def]
        assert executor == "local" and resume is False and progress is False
        sweeps.append({"spec": spec, "out": Path(out)})

    def open_sweep(path):  # type: ignore[no-untyped-def]
        units = pd.DataFrame({"unit_id": [f"u{s}" for s, _ in ckpts], "status": "done",
                              "message": None})
        by_id = {f"u{s}": (s, p) for s, p in ckpts}
        return types.SimpleNamespace(units=units, open_unit=lambda uid: types.SimpleNamespace(
            meta={"model": str(by_id[uid][1]), "step": by_id[uid][0]}, name=uid))

    reports: list[tuple[list[Any], Path, list[str]]] = []

    def write_report(measurements, out_path, labels, formats=("png", "svg", "pdf")):  # type: ignore[no-untyped-def]
        reports.append(([m.name for m in measurements], Path(out_path), list(labels)))
        Path(out_path).write_text("<html></html>")
        return Path(out_path)

    monkeypatch.setitem(sys.modules, "blockcoupling.store.record",
                        types.SimpleNamespace(measure_to_dir=measure_to_dir))
    monkeypatch.setitem(sys.modules, "blockcoupling.report.html",
                        types.SimpleNamespace(write_report=write_report))
    monkeypatch.setattr(sweep_pkg, "run_sweep", run_sweep)
    monkeypatch.setattr(sweep_pkg, "open_sweep", open_sweep)
    monkeypatch.setattr(tiny_lm.TinyLMConfig, "quick", classmethod(lambda cls: SMALL))

    path = demo.run_demo(tmp_path / "out", quick=True, cache_dir=root, progress=False,
                         family=False, executor="local")

    assert path == tmp_path / "out" / "report.html" and path.is_file()
    minilm = ["MiniLM pretrained", "MiniLM random init", "MiniLM pretrained, LN directions removed",
              "MiniLM random init, LN directions removed"]
    tiny = [f"tiny LM step {s}" for s, _ in ckpts]
    assert [c["meta"]["label"] for c in calls] == minilm
    assert reports == [([f"measurement-{i + 1}" for i in range(4)] + [f"u{s}" for s, _ in ckpts],
                        path, minilm + tiny)]
    assert len({c["out_dir"] for c in calls}) == len(calls)
    assert all(c["out_dir"].parent == tmp_path / "out" for c in calls)
    pre, rnd = calls[0]["model"], calls[1]["model"]
    assert pre.config.to_dict() == rnd.config.to_dict()
    assert calls[2]["model"] is pre and calls[3]["model"] is rnd  # same models, both views
    assert calls[0]["prompts"] == [demo.CAPITAL_PROMPT]
    assert calls[0]["meta"]["revision"] != calls[1]["meta"]["revision"]
    for c in calls[:2]:
        assert "remove_norm_directions" not in c["kw"]
    for c in calls[2:4]:
        assert c["kw"]["remove_norm_directions"] is True and c["meta"]["remove_norm_directions"]
    for c in calls:
        assert c["kw"]["coupling"] == ("depth",) and c["kw"]["tokens"] == "last"
        assert {"model", "label", "revision"} <= set(c["meta"])
    # the tiny LM: ONE sweep over its checkpoint folders, on the executor asked for
    [sw] = sweeps
    assert sw["out"] == tmp_path / "out" / "tinylm"
    assert sw["spec"]["models"] == [{"label": "tiny LM",
                                     "checkpoints": [str(p.resolve()) for _, p in ckpts]}]
    assert sw["spec"]["prompts"] == [{"name": "demo:corpus",
                                      "texts": [demo.demo_prompts("corpus")[0][:16]]}]
    assert sw["spec"]["measure"]["coupling"] == ["depth"]
    assert all(k <= SMALL.n_embd for k in sw["spec"]["measure"]["k"])
    log = tiny_lm.training_log(SMALL, root)
    measured = reports[0]
    assert measured[2][4:] == tiny
    # ... and the cached monitor directory of its training, copied beside the runs
    from blockcoupling.runs.read import open_sweep as real_open_sweep

    mon = real_open_sweep(tmp_path / "out" / "tinylm-monitor")
    assert sorted(mon.units["step"].tolist()) == [s for s, _ in ckpts]
    assert mon.units["status"].eq("done").all()
    assert mon.manifest["kind"] == "monitor"
    assert set(log["checkpoints"]) == {str(s) for s, _ in ckpts}


def test_monitor_does_not_change_the_demo_training(
    tmp_path: Path, trained: tuple[Path, list[tuple[int, Path]]]
) -> None:
    """The demo's tiny LM is trained with the coupling monitor; without it the weights and the
    losses are bit-identical (the monitor measured at every checkpoint step, in the loop)."""
    root, ckpts = trained
    log = tiny_lm._train_and_save(SMALL, tmp_path, progress=False, monitor=False)
    assert not (tmp_path / tiny_lm.MONITOR_DIR).exists()
    assert log["train_loss"] == tiny_lm.training_log(SMALL, root)["train_loss"]
    for step, path in ckpts:
        with_monitor, without = _state(path), _state(tmp_path / tiny_lm.checkpoint_name(step))
        assert with_monitor.keys() == without.keys()
        for name in with_monitor:
            assert torch.equal(with_monitor[name], without[name]), (step, name)
    monitored = tiny_lm.monitor_dir(SMALL, root)
    import blockcoupling as bc

    units = bc.open_sweep(monitored).units
    assert units["status"].eq("done").all() and len(units) == len(ckpts)


@pytest.mark.slow  # end to end; CI runs every test (-m 'slow or not slow')
def test_run_demo_end_to_end_quick(tmp_path: Path, ray_cluster: str) -> None:
    """The real thing: MiniLM runs, the tiny LM trained with the monitor and its checkpoints
    measured by a sweep on the (session's) local Ray cluster, the family study, the report."""
    path = demo.run_demo(tmp_path / "out", quick=True, cache_dir=tmp_path / "cache",
                         progress=False)
    assert path.is_file() and path.stat().st_size > 0
    runs = {p.name for p in (tmp_path / "out").iterdir() if (p / "manifest.json").is_file()}
    assert runs == {"minilm-pretrained", "minilm-random", "minilm-pretrained-normdirs",
                    "minilm-random-normdirs"}
    from blockcoupling.studies.sweep import is_sweep_dir

    assert is_sweep_dir(tmp_path / "out" / "tinylm")
    assert is_sweep_dir(tmp_path / "out" / "tinylm-monitor")
    cfg = tiny_lm.TinyLMConfig.quick()
    assert (tmp_path / "cache" / cfg.cache_key() / "training.json").is_file()
    import blockcoupling as bc

    # (b) the checkpoints went through the sweep on Ray; the monitor measured them in training
    swept, monitored = bc.open_sweep(tmp_path / "out" / "tinylm"), bc.open_sweep(
        tmp_path / "out" / "tinylm-monitor")
    assert swept.manifest["sessions"][-1]["executor"] == "ray"
    assert "ray_version" in swept.manifest["sessions"][-1]
    for s in (swept, monitored):
        assert s.units["status"].eq("done").all()
        assert sorted(s.units["step"].tolist()) == list(cfg.checkpoints)
    # the same weights measured in the training loop and from the saved checkpoint agree
    key = ["step", "prompt_id", "layer_a", "layer_b", "k", "p", "variant", "orientation"]
    on = swept.coupling[swept.coupling["kind"] == "depth"]
    both = monitored.coupling[monitored.coupling["kind"] == "depth"].merge(
        on, on=key, suffixes=("_mon", "_sweep"))
    assert len(both) > 0 and len(both) == len(on)  # the sweep's prompt is the monitor's first
    diff = (both["value_mon"] - both["value_sweep"]).abs().max()
    assert diff < 1e-5, diff
    # the demo's point, from its own runs: with the LN directions removed the random-init
    # MiniLM is at chance and the pretrained one is not
    import blockcoupling as bc

    def above_chance(sub: str) -> float:
        return bc.open_run(tmp_path / "out" / sub).mean_depth_coupling(
            10, variant="coupling_vs_null")

    rnd, pre = above_chance("minilm-random-normdirs"), above_chance("minilm-pretrained-normdirs")
    raw_rnd = above_chance("minilm-random")
    assert abs(rnd) < 0.05 and pre > 0.15 and raw_rnd > 0.2
    # (c) the quick tiny-LM family study ran through a sweep and wrote its result
    fam = tmp_path / "out" / "lm-family"
    assert (fam / "study.html").is_file()
    assert bc.open_sweep(fam / "sweep").catalogue["status"].eq("done").all()
    study = json.loads((fam / "study.json").read_text())
    assert {"H1", "H2"} == set(study["hypotheses"]) and study["statement"]


def test_monitor_is_optional_and_a_missing_or_outdated_one_retrains(tmp_path: Path) -> None:
    """The family trains without the monitor; asking for it later trains again (identical
    weights) and writes it; a monitor directory for other prompts/options is replaced."""
    cfg = tiny_lm.TinyLMConfig(**{**SMALL.to_dict(), "max_steps": 4, "checkpoints": (0, 4)})
    plain = tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False, monitor=False)
    target = tiny_lm.tiny_lm_dir(cfg, tmp_path)
    assert not (target / tiny_lm.MONITOR_DIR).exists()
    before = _state(plain[-1][1])
    tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False)  # monitor=True: trains again
    assert tiny_lm._monitor_is_current(cfg, target)
    after = _state(plain[-1][1])
    assert all(torch.equal(before[n], after[n]) for n in before)
    # an outdated monitor (as if monitor_options had changed since it was cached)
    from blockcoupling.store import collection as store

    manifest = store.load_manifest(target / tiny_lm.MONITOR_DIR)
    manifest["spec"]["monitor"]["config"]["k"] = [99]
    store.write_json(target / tiny_lm.MONITOR_DIR / store.MANIFEST, manifest)
    assert not tiny_lm._monitor_is_current(cfg, target)
    tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False)
    assert tiny_lm._monitor_is_current(cfg, target)
    # monitor=False never looks at it
    tiny_lm.train_tiny_lm(cfg, tmp_path, progress=False, monitor=False)


def test_demo_sweep_for_other_checkpoints_is_measured_afresh(
        tmp_path: Path, trained: tuple[Path, list[tuple[int, Path]]]) -> None:
    """The demo's sweep directory is its own derived output: when the checkpoints (e.g. the
    cache's location or key) change, running again replaces it instead of refusing to
    resume a sweep with another spec."""
    _, ckpts = trained

    def spec(paths: list[Path]) -> dict[str, Any]:
        return {"models": [{"label": "tiny LM", "checkpoints": [str(p) for p in paths]}],
                "prompts": [{"name": "demo:corpus", "texts": ["The cat"]}],
                "measure": {"coupling": ["depth"], "k": [2], "tokens": "last"}}

    root = tmp_path / "tinylm"
    first = demo._sweep_measurements(spec([ckpts[0][1]]), root, "local", progress=False)
    assert [m.meta["step"] for _, m in first] == [0]
    (root / "marker").write_text("kept while the sweep is resumed")
    again = demo._sweep_measurements(spec([ckpts[0][1]]), root, "local", progress=False)
    assert [uid for uid, _ in again] == [uid for uid, _ in first]
    assert (root / "marker").is_file()  # the same spec: resumed in place, not rebuilt
    other = demo._sweep_measurements(spec([p for _, p in ckpts]), root, "local", progress=False)
    assert [m.meta["step"] for _, m in other] == [s for s, _ in ckpts]
    assert not (root / "marker").exists()  # another spec: measured afresh
