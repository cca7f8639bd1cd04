"""The names of a step's sections, in step order: shared by the span recorder and the report.

Their own module, without torch: `musubi report` reads them (and only them) to analyse a run, and a
user who only wants the HTML report should not pay the 4-7 s of CPU of `import torch`.
"""

from __future__ import annotations

DATA, H2D, FORWARD, BACKWARD, GRAD_COMM = "data", "h2d", "forward", "backward", "grad_comm"
OPTIMIZER, LOG, CHECKPOINT, EVAL = "optimizer", "log", "checkpoint", "eval"
#: Every section name a step record may hold, in step order.
SECTIONS = (DATA, H2D, FORWARD, BACKWARD, GRAD_COMM, OPTIMIZER, LOG, CHECKPOINT, EVAL)
