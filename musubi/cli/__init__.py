"""The `musubi` command line (typer + rich): the only package that imports typer."""

from musubi.cli.app import app

__all__ = ["app"]
