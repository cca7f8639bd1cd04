"""Datasets: synthetic generators, COCO reading, text tokens."""
