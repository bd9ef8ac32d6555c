"""The measurement engine: model -> boundaries -> Jacobians -> top-K SVD -> tables.

Pure mathematics at the bottom (``metrics``, ``svd``, ``trajectory``, ``spectra``, ``pairs``),
model access above it (``blocks``, ``capture``, ``jacobian``, ``fastpath``), the orchestration on
top (``measure``). Each module's contract is its docstring; the map: ``docs/DESIGN.md``.
"""
