"""The ViT study: DeiT-style ViTs trained with stochastic depth, their coupling and accuracy.

- `model`: the ViT (transformers' BEiT configured as DeiT), presets, ``load_vit``;
- `data`: digits (offline, scikit-learn) and CIFAR-10 (image folder or ``datasets``);
- `train`: ``VitTrainConfig`` and ``train_vit(config, out_dir) -> out_dir`` (idempotent,
  resumable), coupling measured during training and at the end;
- `record`: its ``metrics.json``, sealed with the model's checksum, read back verified;
- `grid`: the drop-path x weight-decay grid (the paper's values by default).
- `report`: its figures and HTML page (drawn with the report layer's page skeleton).
"""
