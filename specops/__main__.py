"""``python -m specops``: the command-line interface (what the ``specops`` script runs)."""

from specops.cli import main

main()
