"""Musubi's version, kept equal to pyproject.toml's: `musubi.__version__`, and what run.json and env.json record."""

VERSION = "0.1.0"
