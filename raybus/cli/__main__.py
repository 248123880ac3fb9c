"""``python -m raybus.cli``."""

from raybus.cli import main

main()
