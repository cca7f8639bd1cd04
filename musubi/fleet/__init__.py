"""Fleets: job graph, GPU packer, the local executor, retries, external command jobs."""
