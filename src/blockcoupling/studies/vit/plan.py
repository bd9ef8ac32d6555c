"""The ViT trainings' ``--dry-run`` plans (``vit-train``, ``vit-grid``, a grid spec given to
``sweep``: the kind's ``plan``, `blockcoupling.runs.kinds`): per training run its epochs and
steps, the epochs measured and the MeasurePlan of one measurement and of the final one,
computed on the untrained model of the run's shape with the images the run measures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blockcoupling.runs.plans import RunPlan, StudyPlan

__all__ = ["plan_grid", "plan_vit_training"]


def plan_vit_training(configs: Sequence[Any], axes: Sequence[str] = (),
                      study: str = "ViT training") -> StudyPlan:
    """The plan of training each ``VitTrainConfig``: epochs, steps, the epochs measured
    (``monitor_images`` test images each) and the final measurement (``final_images``);
    ``axes``: the grid's extra axes (in the runs' names). Each measurement's plan is
    ``engine.plan.plan_measure`` on the block spec of the run's model, built on the meta
    device (its shape only: no weights, no forward pass), and its images' real positions."""
    import torch

    from blockcoupling.engine.blocks import find_blocks
    from blockcoupling.studies.vit.grid import run_name
    from blockcoupling.studies.vit.model import build_vit
    from blockcoupling.studies.vit.train import measured_tokens, model_shape, split_sizes

    runs = []
    for c in configs:
        shape, size, channels = model_shape(c)
        with torch.device("meta"):
            model = build_vit(shape, image_size=size, num_channels=channels, num_labels=10,
                              drop_path=c.drop_path, seed=c.seed)
        spec = find_blocks(model)
        n_train, n_test, _ = split_sizes(c)
        positions = (size // shape.patch_size) ** 2 + 1  # patches and [CLS]
        steps = c.total_steps(n_train)
        params = sum(p.numel() for p in model.parameters())
        lengths = {n: [positions] * min(n, n_test) for n in (c.monitor_images, c.final_images)}
        runs.append(RunPlan(
            name=run_name(c, axes), unit="epoch", checkpoints=c.measured_epochs(n_train),
            steps=steps, parameters=params,
            training_flops=6.0 * params * positions * c.batch_size * steps,
            measure=_images_plan(spec, c, lengths[c.monitor_images], measured_tokens(c.tokens)),
            final=_images_plan(spec, c, lengths[c.final_images],
                               measured_tokens(c.tokens, both=True))))
    return StudyPlan(study=study, runs=runs)


def _images_plan(spec: Any, config: Any, lengths: list[int], tokens: Any) -> Any:
    """The MeasurePlan of one measurement of a run of ``config`` (its model's ``spec``):
    images of ``lengths`` real positions at ``tokens``."""
    from blockcoupling.engine.plan import plan_measure
    from blockcoupling.studies.vit.train import images_config

    cfg = images_config(config.k, tokens)
    cfg.check_model(spec.num_layers, spec.hidden_size)
    return plan_measure(cfg, spec, lengths, model=f"ViT {config.preset}")


def plan_grid(base: Any, kwargs: dict[str, Any], study: str = "ViT training") -> StudyPlan:
    """The plan of a ViT grid (``base`` config and [`run_grid`][blockcoupling.studies.vit.grid.run_grid]'s
    keyword arguments, e.g. from ``load_grid_spec``): every run's config, checked as the grid
    checks it."""
    from blockcoupling.studies.vit.grid import grid_axes, grid_configs

    extra = {k: kwargs.get(k) for k in ("train_limits", "label_noises")}
    return plan_vit_training(grid_configs(base, kwargs.get("drop_paths", ()),
                                          kwargs.get("weight_decays", ()),
                                          kwargs.get("seeds", (0,)), **extra),
                             grid_axes(**extra), study)
