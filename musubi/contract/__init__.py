"""The contract between Musubi's processes: the bottom layer every other package may import.

What a launcher, a rank, a fleet executor and a report reader must agree on lives here, each in
one module: the world (`world`: ranks, device, attempt, the one init site), the torchrun entry
(`rendezvous`), the fault-injection switch (`inject`), the run directory's paths (`run_files`),
the `MUSUBI_*` environment variables (`env`), the records that cross a process boundary
(`records`: exit, OOM, progress, start-up marks) and the one error type for bad input (`errors`).
Nothing here imports the rest of musubi; this `__init__` imports nothing, so reading a path
name does not load torch.
"""
