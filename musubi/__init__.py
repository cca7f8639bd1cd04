"""Musubi: train a fleet of PyTorch models across many GPUs as one coordinated system."""

__version__ = "0.1.0"
