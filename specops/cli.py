"""The one command-line interface. Sub-commands import their modules lazily so `--help` stays instant."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="specops",
    help="EAGLE-3 speculative decoding for LoRA-fine-tuned models: serve it, measure it, explain it.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
