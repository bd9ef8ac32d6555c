"""A sweep expanded into units: one (model, revision or checkpoint, prompt set, config) each.

Every unit is measured into its own resumable run directory ``SWEEP/units/<unit_id>``. The id
is stable: it is derived from what the unit measures (model source, revision, checkpoint
folder, prompt set, prompt limit and ``MeasureConfig.config_hash()``), never from the order of
the spec, so the same unit has the same id in every sweep and across ``--resume``. The weights
hash is known only once the weights are loaded: it is stored in the unit's manifest and the
sweep catalogue, a resumed unit refuses other weights, and units with identical weights are
reported as duplicates.
"""

from __future__ import annotations

import dataclasses
import glob
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.loading import ModelSource
from blockcoupling.store.collection import UnitRecord, collection_unit_id
from blockcoupling.studies.sweep.spec import ModelSpec, Resources, SpecError, SweepSpec

_STEP_RE = re.compile(r"(?:^|[^a-z])(?:step|checkpoint|ckpt|iter)[-_]?(\d+)$", re.IGNORECASE)
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def parse_step(name: str | None) -> int | None:
    """The training step named by a revision or folder: ``step1000`` (Pythia),
    ``checkpoint-500`` (HF Trainer), ``ckpt_20``, ``iter-3``; None otherwise."""
    if not name:
        return None
    m = _STEP_RE.search(Path(str(name)).name)
    return int(m.group(1)) if m else None


def config_hash(cfg: MeasureConfig) -> str:
    """``cfg.config_hash()``: the stable hash of the fields that change numbers."""
    return cfg.config_hash()


@dataclass(frozen=True)
class Unit(UnitRecord):
    """One measurement of a sweep: the collection's `UnitRecord` (id, names, config, hash,
    local inputs) and how its model is loaded (plain data: it travels to Ray workers as
    is)."""

    dtype: str = "auto"
    device: str = "auto"
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    trust_remote_code: bool = False
    prompt_texts: tuple[str, ...] = ()   # an inline prompt set's texts (prompt_set inline:NAME)
    loading: dict[str, Any] = dataclasses.field(default_factory=dict)  # device_map, quantize, ...
    init: str = "pretrained"  # or "random": the model's config with seeded random weights
    init_seed: int = 0

    def source(self) -> ModelSource:
        """The unit's model, as `ModelSource.load` loads it."""
        return ModelSource(model=self.model, revision=self.revision, dtype=self.dtype,
                           device=self.device, trust_remote_code=self.trust_remote_code,
                           init=self.init, init_seed=self.init_seed, **self.loading)


def unit_id(*, model: str, revision: str | None, prompt_set: str, limit: int | None,
            cfg_hash: str, label: str, step: int | None,
            prompt_texts: tuple[str, ...] = (), quantize: str | None = None,
            inputs: dict[str, str] | None = None, init: str = "pretrained",
            init_seed: int = 0) -> str:
    """A sweep unit's id: ``<label>-<step or revision>-<prompt set>-<hash12>``; the hash
    covers the identity (model source, revision, prompt set, limit, config hash, the content
    hash of every local input such as a prompt file, and a random init with its seed)."""
    identity = ([model, revision, prompt_set, limit, cfg_hash]
                + ([list(prompt_texts)] if prompt_texts else [])
                + ([["quantize", quantize]] if quantize else [])
                + ([sorted(inputs.items())] if inputs else [])
                + ([["init", init, init_seed]] if init != "pretrained" else []))
    where = f"step{step}" if step is not None else (revision or "main")
    prompt = prompt_set.removeprefix("builtin:").removeprefix("hf:").removeprefix("inline:")
    return collection_unit_id([(label, 24), (where, 24), (Path(prompt).stem or prompt, 20)],
                              identity)


def discover_checkpoints(pattern: str | tuple[str, ...]) -> list[tuple[Path, int | None]]:
    """Local checkpoint folders (HF Trainer layout ``.../checkpoint-N`` with config.json),
    sorted by step: a glob or a list of folders -> [(folder, step)]."""
    patterns = (pattern,) if isinstance(pattern, str) else tuple(pattern)
    found: dict[Path, int | None] = {}
    for pat in patterns:
        is_glob = any(c in pat for c in "*?[")
        matches = sorted(glob.glob(pat)) if is_glob else [pat]
        for m in matches:
            p = Path(m)
            if p.is_dir() and (p / "config.json").is_file():
                found[p.resolve()] = parse_step(p.name)
            elif not is_glob and not p.exists():
                raise SpecError(f"checkpoints: {m} does not exist; fix the path (relative to "
                                "the spec file) or remove it from the list")
            else:  # listed, or matched by the glob, but not a model folder: never dropped
                raise SpecError(
                    f"checkpoints: {m} is not a checkpoint folder (no config.json); "
                    + ("narrow the glob so that it matches only checkpoint folders (e.g. "
                       "checkpoint-*)" if is_glob else "remove it from the list"))
    if not found:
        raise SpecError(
            f"checkpoints {', '.join(patterns)}: no checkpoint folder found (a folder with "
            "config.json, e.g. runs/train/checkpoint-500); check the glob, relative to the "
            "spec file")
    return sorted(found.items(), key=lambda kv: (kv[1] is None, kv[1] or 0, str(kv[0])))


def _targets(m: ModelSpec) -> list[tuple[str, str | None, int | None]]:
    """(model source, revision, step) for each revision or checkpoint of one entry."""
    if m.checkpoints is not None:
        return [(str(p), None, step) for p, step in discover_checkpoints(m.checkpoints)]
    assert m.model is not None
    if not m.revisions:
        return [(m.model, None, parse_step(m.model) if Path(m.model).exists() else None)]
    return [(m.model, r, parse_step(r)) for r in m.revisions]


def expand(spec: SweepSpec) -> list[Unit]:
    """Every unit of the sweep, in spec order (models, then revisions/steps, then prompts)."""
    from blockcoupling.runs.identity import input_hashes, local_inputs

    cfg_dict = spec.config.to_dict()
    h = config_hash(spec.config)
    inputs = {ps: input_hashes(local_inputs(ps)) for ps in spec.prompts}
    units: list[Unit] = []
    for m in spec.models:
        res: Resources = m.resources
        for src, rev, step in _targets(m):
            for ps in spec.prompts:
                texts = spec.inline_prompts.get(ps.removeprefix("inline:"), ()) \
                    if ps.startswith("inline:") else ()
                uid = unit_id(model=src, revision=rev, prompt_set=ps, limit=spec.limit,
                              cfg_hash=h, label=m.label, step=step, prompt_texts=texts,
                              quantize=dict(m.loading).get("quantize"), inputs=inputs[ps],
                              init=m.init, init_seed=m.init_seed)
                units.append(Unit(
                    unit_id=uid, label=m.label, model=src, revision=rev, step=step,
                    prompt_set=ps, limit=spec.limit, config=cfg_dict, config_hash=h,
                    dtype=m.dtype, device=m.device, num_cpus=res.num_cpus,
                    num_gpus=res.num_gpus, trust_remote_code=m.trust_remote_code,
                    prompt_texts=texts, loading=dict(m.loading), inputs=inputs[ps],
                    init=m.init, init_seed=m.init_seed))
    ids = [u.unit_id for u in units]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SpecError(f"the spec names the same unit twice ({dup}); remove the repeated "
                        "revision, checkpoint or prompt set")
    return units
