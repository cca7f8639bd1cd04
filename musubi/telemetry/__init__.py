"""Per-rank telemetry: step spans (CUDA events resolved later), NVML/psutil samples, live straggler watch.

Everything here stays out of the training step's way: a span boundary costs one
`perf_counter_ns` and (on GPU) one recorded CUDA event; events are resolved and
lines written by a background thread (`writer.py`); hardware is sampled by
another (`sampler.py`). Files: `JOB/telemetry/rank{r}.jsonl` (steps, memory),
`JOB/telemetry/sampler-rank{r}.jsonl` (hardware), `JOB/telemetry/stragglers.jsonl`
(live flags and `cleared` records, rank 0).
"""
