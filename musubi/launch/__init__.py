"""The parent side of a job: torchrun and rendezvous arguments, nodes, pinning, process trees, restarts, drills.

Never imports the per-rank side (`musubi.worker`): it names the worker module as a string.
"""
