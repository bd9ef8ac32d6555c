"""Figures and the self-contained HTML report (matplotlib: imported only when used)."""
