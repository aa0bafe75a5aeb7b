"""One exception type for problems a user can fix: the CLI prints its message on one line, no traceback."""


class SpecopsError(Exception):
    """Bad input, a missing file, a model that does not fit: something the user can act on."""
