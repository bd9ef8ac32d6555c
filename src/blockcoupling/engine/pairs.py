"""Which Jacobians are compared, for each coupling kind (DEFINITIONS.md).

A Jacobian is named by a key ``(layer, token_in, token_out)`` (layer 1-based, tokens 0-based):
``J^layer_{token_in token_out}``. A compared pair is ``(a, b)``: ``a`` is the measured
Jacobian (J1), ``b`` the one whose top-K singular vectors form the basis (J2). Pure functions
on integers: no tensors here.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

from blockcoupling.errors import BlockCouplingError

Key = tuple[int, int, int]  # (layer, token_in, token_out)
Pair = tuple[Key, Key]  # (measured a, basis b)


#: Model types (HF ``config.model_type``, ``BlockSpec.arch``) whose position 0 is a class
#: token: BERT-style encoders (their tokenizers put [CLS] / <s> first) and ViTs.
CLS_ARCHS: frozenset[str] = frozenset({
    "bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert", "deberta",
    "deberta-v2", "mpnet", "camembert", "vit", "deit", "beit", "dinov2", "clip_vision_model",
})


def cls_position(arch: str, causal: bool) -> int | None:
    """Position of the model's [CLS] token (0 for `CLS_ARCHS` encoders), else None."""
    return 0 if (not causal and arch in CLS_ARCHS) else None


def resolve_tokens(spec: str | Sequence[int], n: int, *, cls: int | None = None) -> list[int]:
    """Positions selected by ``tokens`` in a prompt of ``n`` real tokens (negative = from end).

    ``"auto"`` is ``"cls"`` where the model has a [CLS] token (``cls``, see
    `cls_position`) and ``"last"`` otherwise."""
    if n < 1:
        raise BlockCouplingError("a prompt has no tokens; remove empty prompts")
    if spec == "auto":
        return resolve_tokens("last" if cls is None else "cls", n, cls=cls)
    if spec == "cls":
        if cls is None:
            raise BlockCouplingError(
                "tokens='cls': this model has no [CLS] token blockcoupling knows of (ViTs and "
                "BERT-style encoders have it at position 0); use 'last', 'all' or positions"
            )
        return [cls]
    if spec == "last":
        return [n - 1]
    if spec == "all":
        return list(range(n))
    if isinstance(spec, str):
        raise BlockCouplingError(f"tokens={spec!r}: give auto, cls, last, all or token "
                                 "positions such as 0,-1")
    out: list[int] = []
    for t in spec:
        pos = t + n if t < 0 else t
        if not 0 <= pos < n:
            raise BlockCouplingError(
                f"token position {t} is out of range for a prompt of {n} tokens "
                f"(valid: 0..{n - 1}, or -1..-{n} from the end)"
            )
        if pos not in out:
            out.append(pos)
    return out


def layer_pairs(layers: Sequence[int], mode: str) -> list[tuple[int, int]]:
    """``same``: (l, l) for each layer; ``all``: every ordered (l, l')."""
    if mode == "same":
        return [(la, la) for la in layers]
    return list(product(layers, layers))


def kind_pairs(kind: str, *, tokens: Sequence[int], layers: Sequence[int], n: int,
               causal: bool, pairs_mode: str = "same") -> list[Pair]:
    """Every (measured, basis) pair that the coupling kind compares.

    - ``depth``: for each selected token t, J^l_tt against J^l'_tt for all layers l, l'.
    - ``self``: for each layer pair, J^l_tt against J^l'_t't' for all selected t, t'.
    - ``fixed_input``: for each selected input token t1, J^l_{t1 t2} against J^l'_{t1 t2'}
      across outputs t2, t2' >= t1 (every position for an encoder).
    - ``fixed_output``: for each selected output token t2, J^l_{t1 t2} against J^l'_{t1' t2}
      across inputs t1, t1' <= t2 (every position for an encoder).
    """
    if kind == "depth":
        return [((la, t, t), (lb, t, t)) for t in tokens for la in layers for lb in layers]
    lps = layer_pairs(layers, pairs_mode)
    if kind == "self":
        return [((la, t, t), (lb, u, u)) for la, lb in lps for t in tokens for u in tokens]
    if kind == "fixed_input":
        out: list[Pair] = []
        for t1 in tokens:
            outs = range(t1, n) if causal else range(n)
            out += [((la, t1, t2), (lb, t1, u2)) for la, lb in lps for t2 in outs for u2 in outs]
        return out
    if kind == "fixed_output":
        out = []
        for t2 in tokens:
            ins = range(0, t2 + 1) if causal else range(n)
            out += [((la, t1, t2), (lb, u1, t2)) for la, lb in lps for t1 in ins for u1 in ins]
        return out
    raise BlockCouplingError(f"unknown coupling kind {kind!r}")


def needed_keys(pairs: Sequence[Pair]) -> dict[int, list[tuple[int, int]]]:
    """Layer -> sorted distinct (token_in, token_out) pairs whose Jacobians the pairs use."""
    by_layer: dict[int, set[tuple[int, int]]] = {}
    for a, b in pairs:
        for layer, t_in, t_out in (a, b):
            by_layer.setdefault(layer, set()).add((t_in, t_out))
    return {layer: sorted(v) for layer, v in sorted(by_layer.items())}


def influence_keys(layers: Sequence[int], *, n: int) -> dict[int, list[tuple[int, int]]]:
    """Cross-token influence on the last token: J^l_{j, n-1} for every input j <= n-1."""
    return {la: [(j, n - 1) for j in range(n)] for la in layers}


def default_figure_window(layers: Sequence[int], width: int = 8) -> tuple[int, int]:
    """The layer window whose K x K matrices are stored for the figures: ``width`` layers in
    the middle of the selected ones (the paper shows blocks 9..16)."""
    if len(layers) <= width:
        return layers[0], layers[-1]
    start = (len(layers) - width) // 2
    return layers[start], layers[start + width - 1]
