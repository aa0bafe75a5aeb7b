"""One exception type for problems a user can fix, and the CLI wrapper that reports it on one line."""

from __future__ import annotations

import contextlib
import functools


class SpecopsError(Exception):
    """Bad input, a missing file, a model that does not fit: something the user can act on."""


@contextlib.contextmanager
def naming(source: str):
    """Prefix a SpecopsError raised inside with ``source``: checks that parse a config know what is wrong with it,
    the loader that calls them knows which file it came from."""
    try:
        yield
    except SpecopsError as e:
        raise SpecopsError(f"{source}: {e}") from None


def clean_errors(fn=None, *, interrupted: str = "interrupted"):
    """A CLI command whose user-fixable problems end with one line on stderr and exit code 2, no traceback; Ctrl-C
    prints ``interrupted`` (say how to resume, where the command can) and exits 130. Use as ``@clean_errors`` or
    ``@clean_errors(interrupted="...")``."""
    if fn is None:
        return functools.partial(clean_errors, interrupted=interrupted)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import typer

        try:
            return fn(*args, **kwargs)
        except SpecopsError as e:
            typer.secho(f"error: {e}", fg="red", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.secho(interrupted, fg="yellow", err=True)
            raise typer.Exit(130) from None

    return wrapper
