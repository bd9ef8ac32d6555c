"""``python -m blockcoupling``."""

from blockcoupling.cli import main

main()
