"""Rank 0's live straggler watch: a thread that tails every rank's telemetry file.

No collective and nothing in the step: the writers flush every half second, this
thread reads the new lines once a second, feeds each step that every rank has
recorded to the streaming detector, and on a new flag logs one line naming the
rank and the section, and appends it to `telemetry/stragglers.jsonl`. While a
rank stays flagged, a `straggler now` line (and a `status` record) says again,
at most every LINE_EVERY_S, how much slower it is now and in which section; the
fleet's live table shows the same from the file (`current_stragglers`).

A newly flagged rank is first checked against the ranks' hardware samples (`sampler-rank{r}.jsonl`,
tailed the same way, over the steps the detector holds): a rank whose GPU idles for its own host while
its cores are quiet (`host_lag`) is logged once at info level and recorded as `host_lag`, not flagged;
it is flagged as soon as that no longer holds while the detector still has it (its GPU got slow, or
another process took its cores).

A rank's records arrive in step order, so once every rank has recorded a later
step, a step still missing a rank's record will never be complete (the writer
dropped it): it is skipped, and the steps after it are scored as usual. At most
MAX_PENDING steps are held (a rank whose file stopped growing cannot make the
others' records pile up).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from musubi.store.rundir import read_jsonl
from musubi.telemetry.host_lag import host_lag, mean_figures
from musubi.telemetry.straggler import LONG, RankScore, StragglerDetector

log = logging.getLogger("musubi.telemetry")
POLL_S = 1.0
MAX_PENDING = 512  # steps held while waiting for a rank's record
#: The live flags of a job (in its telemetry folder): rank 0's watch writes them, the report and the fleet read.
FLAGS_FILE = "stragglers.jsonl"
#: At most one `straggler now` line per this many seconds while a rank stays flagged: a console that
#: says it once a step would bury the progress bar, one that says it only once hides that it goes on.
LINE_EVERY_S = 10.0
#: Hardware samples kept per rank (at the sampler's 2 Hz default: the last 16 s). A flag is judged on
#: those taken since the oldest step the detector holds, or on the last MIN_SAMPLES when fewer.
KEEP_SAMPLES = 32
MIN_SAMPLES = 2


class StragglerWatch:
    """Tail `rank{r}.jsonl` of `world` ranks in `folder`; flag stragglers as they appear."""

    def __init__(self, folder: Path, world: int, threshold: float, start: bool = True) -> None:
        self.folder, self.world = folder, world
        self.detector = StragglerDetector(threshold)
        self._offsets: dict[str, int] = {}  # per file name: bytes read
        self._partial: dict[str, str] = {}  # per file name: an unfinished last line
        self._samples: list[deque[dict[str, Any]]] = [deque(maxlen=KEEP_SAMPLES) for _ in range(world)]
        self._step_t: deque[float] = deque(maxlen=LONG)  # start times of the steps the detector holds
        self._excused: dict[int, RankScore] = {}  # flagged by the detector, held back as host lag
        self._flagged_at: dict[int, int] = {}  # ranks announced, at the step they were
        self._pending: dict[int, dict[int, dict[str, Any]]] = {}
        self._next = 1  # the next step to hand to the detector
        self._seen = [0] * world  # per rank: the last step read
        self.skipped = 0  # steps passed over with a rank's record missing
        self._last_line = float("-inf")  # time.monotonic() of the last flag or `straggler now` line
        if start:
            self.start()

    def start(self) -> None:
        """Start (or, after close, start again) the thread that polls the files; the detector's state is kept."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="musubi-straggler-watch", daemon=True)
        self._thread.start()

    def _lines(self, name: str) -> list[dict[str, Any]]:
        """The complete records appended to `name` since the last read."""
        try:
            with open(self.folder / name, encoding="utf-8", errors="replace") as f:
                f.seek(self._offsets.get(name, 0))
                chunk = f.read()
                self._offsets[name] = f.tell()
        except OSError:
            return []
        lines = (self._partial.get(name, "") + chunk).split("\n")
        self._partial[name] = lines.pop()  # an unfinished line waits for the next read
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def _read(self, rank: int) -> None:
        for rec in self._lines(f"rank{rank}.jsonl"):
            if rec.get("kind") == "step":
                step = int(rec["step"])
                if step >= self._next:
                    self._pending.setdefault(step, {})[rank] = rec
                self._seen[rank] = max(self._seen[rank], step)
        self._samples[rank].extend(r for r in self._lines(f"sampler-rank{rank}.jsonl") if r.get("kind") == "sample")

    def _host_lag(self, rank: int) -> str | None:
        """host_lag over the samples since the oldest step the detector holds (at least MIN_SAMPLES a rank)."""
        t0 = self._step_t[0] if self._step_t else float("-inf")
        figs = {}
        for r, held in enumerate(self._samples):
            xs = [x for x in held if float(x.get("t", 0.0)) >= t0]
            figs[r] = mean_figures(xs if len(xs) >= MIN_SAMPLES else list(held)[-MIN_SAMPLES:])
        return host_lag(rank, figs)

    def poll(self) -> None:
        """Read what is new and feed complete steps to the detector, in order."""
        for r in range(self.world):
            self._read(r)
        if self._pending and self._next not in self._pending:
            self._next = min(self._pending)  # a resumed run starts past step 1
        while self._pending:
            complete = len(self._pending.get(self._next, {})) == self.world
            # Final without being complete: every rank is past it, or too many steps wait behind it.
            final = min(self._seen) > self._next or len(self._pending) > MAX_PENDING
            if not complete and not final:
                break
            recs = self._pending.pop(self._next, {})
            if complete:
                if self._next > self.detector.warmup:
                    self._step_t.append(min(float(r.get("t", 0.0)) for r in recs.values()))
                for s in self.detector.update(self._next, recs):
                    self._flag(s)
                for rank in self.detector.cleared_now:
                    self._clear(rank, self._next)
                self._recheck(self._next)
            else:
                self.skipped += 1
                if self.skipped == 1:
                    log.info("straggler watch: step %d lacks the record of rank(s) %s; skipped", self._next,
                             sorted(set(range(self.world)) - set(recs)))
            self._next += 1
            if self._pending and self._next not in self._pending and self._next < min(self._pending):
                self._next = min(self._pending)
        self._status()

    def _recheck(self, step: int) -> None:
        """Flag a rank held back as host lag once the lag no longer explains it (the detector still has it)."""
        for rank in sorted(self._excused):
            if rank not in self.detector.active:
                del self._excused[rank]
            elif rank in self.detector.latest and self._host_lag(rank) is None:
                del self._excused[rank]
                s = self.detector.latest[rank]
                s.flagged_at = step
                self._flag(s)

    def _status(self) -> None:
        """The `straggler now` line of the ranks flagged now, when LINE_EVERY_S passed since the last line."""
        d = self.detector
        ranks = sorted(r for r in d.active if r in self._flagged_at and r in d.latest)
        if not ranks or time.monotonic() - self._last_line < LINE_EVERY_S or d.scored_at is None:
            return
        self._last_line = time.monotonic()
        now = [d.latest[r] for r in ranks]
        log.warning("straggler now (steps %d-%d): %s", d.scored_at - d.window + 1, d.scored_at,
                    "; ".join(f"rank {s.rank} is {100 * s.excess:.1f}% of a step slower than the other ranks, "
                              f"most in {s.section} (flagged at step {self._flagged_at[s.rank]})" for s in now))
        self._append([{"kind": "status", "t": round(time.time(), 3), "step": d.scored_at, "rank": s.rank,
                       "section": s.section, "excess": s.excess, "last_share": s.last_share,
                       "flagged_at": self._flagged_at[s.rank]} for s in now])

    def _append(self, recs: list[dict[str, Any]]) -> None:
        with open(self.folder / FLAGS_FILE, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)

    def _flag(self, s: RankScore) -> None:
        lag = self._host_lag(s.rank) if s.rank not in self._flagged_at else None
        if lag is not None:
            self._excused[s.rank] = s
            log.info("straggler watch: rank %d is %.1f%% of a step behind, most in %s (steps %d-%d), but %s: host "
                     "lag, not flagged", s.rank, 100 * s.excess, s.section, s.flagged_at - self.detector.window + 1,
                     s.flagged_at, lag)
            self._append([{"kind": "host_lag", "t": round(time.time(), 3), "step": s.flagged_at, "rank": s.rank,
                           "section": s.section, "excess": s.excess, "evidence": lag}])
            return
        self._flagged_at[s.rank] = s.flagged_at
        share = "" if s.last_share is None else f"; it arrived last at {s.last_share:.0%} of gradient all-reduces"
        if s.history is not None:
            share += f"; its work before the sync is {s.history:.2f}x its own first window"
        log.warning("straggler: rank %d is %.1f%% of a step slower than the other ranks before the gradient "
                    "sync, most in %s (steps %d-%d)%s", s.rank, 100 * s.excess, s.section,
                    s.flagged_at - self.detector.window + 1, s.flagged_at, share)
        self._last_line = time.monotonic()  # the next `straggler now` line comes LINE_EVERY_S after this one
        self._append([{"kind": "straggler", "t": round(time.time(), 3), "step": s.flagged_at, **s.to_dict()}])

    def _clear(self, rank: int, step: int) -> None:
        self._excused.pop(rank, None)
        if self._flagged_at.pop(rank, None) is None:
            return  # held back as host lag: never announced, nothing to clear
        log.warning("straggler cleared: rank %d is back within %.0f%% of a step of the other ranks (steps %d-%d)",
                    rank, 100 * self.detector.threshold, step - self.detector.window + 1, step)
        self._append([{"kind": "cleared", "t": round(time.time(), 3), "step": step, "rank": rank}])

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
            except Exception as e:  # the watch never ends a run
                log.warning("straggler watch stopped: %s", e)
                return

    def close(self) -> None:
        """A last poll (the run's final steps), then stop."""
        self._stop.set()
        self._thread.join(5)
        try:
            self.poll()
        except Exception as e:
            log.warning("straggler watch: last poll failed: %s", e)


def current_stragglers(folder: Path) -> list[dict[str, Any]]:
    """The ranks flagged now in `folder`'s FLAGS_FILE: each one's latest flag or status record, by rank."""
    now: dict[int, dict[str, Any]] = {}
    for rec in read_jsonl(folder / FLAGS_FILE):
        rank = rec.get("rank")
        if not isinstance(rank, int):
            continue
        if rec.get("kind") in ("straggler", "status"):
            now[rank] = rec
        elif rec.get("kind") == "cleared":
            now.pop(rank, None)
    return [now[r] for r in sorted(now)]


def describe(flags: list[dict[str, Any]]) -> str:
    """'rank 1 backward +12.3%' per flagged rank, comma-separated ('-' when none): a table cell."""
    if not flags:
        return "-"
    return ", ".join(f"rank {f['rank']} {f.get('section', '?')} +{100 * float(f.get('excess') or 0):.1f}%"
                     for f in flags)
