"""``python -m specops.serve ARGS``: the same as ``specops serve ARGS``, kept for scripts that start it this way."""

import sys

from specops.cli import app

app(["serve", *sys.argv[1:]], prog_name="python -m specops.serve")
