"""`python -m musubi.cli`: the same command line as the `musubi` script."""

from musubi.cli.app import app

app()
