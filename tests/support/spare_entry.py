"""A tiny rank entry for the warm-spare tests: `python -m tests.support.spare_entry CMD ...`, or forked by a spare.

`info [CODE]`: print what the rank sees (pid, parent, session, cwd, a variable, how it started) and exit CODE;
`signal NAME`: die by that signal; `wait FILE`: write the pid to FILE and wait for SIGTERM, then exit 7.
With SPARE_ENTRY_THREAD=1 at import it leaves a thread running (a module a spare must not fork beside).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

if os.environ.get("SPARE_ENTRY_THREAD") == "1":
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


def on_term(signum: int, frame: object) -> None:  # noqa: ARG001
    """SIGTERM reached the rank: say so, exit 7."""
    print("rank got SIGTERM", flush=True)
    raise SystemExit(7)


def main(argv: list[str], started: float | None = None) -> int:
    """Run one command (see the module docstring); returns the exit code."""
    cmd = argv[0]
    if cmd == "info":
        print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(),
                          "argv": argv, "probe": os.environ.get("SPARE_PROBE"), "forked": started is not None,
                          "started": started, "sys_argv": sys.argv[1:]}), flush=True)
        print("rank stderr line", file=sys.stderr, flush=True)
        return int(argv[1]) if len(argv) > 1 else 0
    if cmd == "signal":
        sig = getattr(signal, argv[1])
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(10)
        return 99
    if cmd == "wait":
        signal.signal(signal.SIGTERM, on_term)
        tmp = Path(argv[1] + ".tmp")  # written whole, then renamed: the test never reads a half-written pid
        tmp.write_text(str(os.getpid()), encoding="ascii")
        os.replace(tmp, argv[1])
        time.sleep(60)
        return 0
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
