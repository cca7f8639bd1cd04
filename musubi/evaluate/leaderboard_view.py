"""The leaderboard as tables: one per quality metric (a top-1 and an mAP50 are not one scale), every cell plain
text (job and metric names are printed as written, never as rich markup). `musubi leaderboard` and the end of
`musubi run` print it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def cell(value: Any, digits: int = 4) -> str:
    """A table cell: '-' for nothing, floats to `digits` significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def leaderboard_table(board: dict[str, Any], table_of: dict[str, Any] | None = None) -> Table:
    """A rich table of leaderboard rows (every cell plain Text: no markup from job names): those of one metric's
    table (`table_of`, an entry of the board's "tables"), or of the whole board."""
    floor = board.get("quality_floor") if isinstance(board.get("quality_floor"), dict) else {}
    if table_of is not None:
        title = "; ".join(str(x) for x in (
            f"{table_of.get('metric')}: {board.get('formula')}", table_of.get("fps_normalisation"),
            f"fps: {table_of['fps_protocol']}" if table_of.get("fps_protocol") else None) if x)
        rows = [r for r in board.get("rows", []) if r.get("table") == table_of.get("metric")]
    else:
        title = "; ".join(str(x) for x in (board.get("formula"), board.get("fps_normalisation"), floor.get("rule"))
                          if x)
        rows = board.get("rows", [])
    table = Table(title=Text(title),
                  title_justify="left")
    for col in ("rank", "job", "model", "metric", "quality", "fps", "runtime", "fps_norm", "score", "note"):
        # fold, never `…`: a narrow terminal wraps a score rather than cutting its digits
        table.add_column(col, justify="right" if col in ("rank", "quality", "fps", "fps_norm", "score") else "left",
                         overflow="fold")
    for r in rows:
        cells = [cell(r.get("rank")), r.get("job"), r.get("model") or r.get("kind"), r.get("metric"),
                 cell(r.get("quality")), cell(r.get("fps")), r.get("fps_runtime"), cell(r.get("fps_norm"), 3),
                 cell(r.get("score")), r.get("reason") or ""]
        table.add_row(*(Text(cell(c) if not isinstance(c, str) else c) for c in cells))
    return table


def print_leaderboard(run_dir: Path, console: Console | None = None, board: dict[str, Any] | None = None) -> None:
    """Print RUN/leaderboard.json (or `board`) as a table (and its warning, if any)."""
    from musubi.evaluate.leaderboard import read_leaderboard

    console = console or pipe_console()
    board = board if board is not None else read_leaderboard(run_dir)
    tables = board.get("tables") if isinstance(board.get("tables"), list) else []
    if not tables:  # nothing scored, or a board written before tables: one table of every row
        console.print(leaderboard_table(board))
    for entry in tables:  # one table per quality metric: a top-1 and an mAP50 are not one scale
        console.print(leaderboard_table(board, entry))
    rest = [r for r in board.get("rows", []) if not r.get("table")]
    if tables and rest:
        console.print(leaderboard_table({**board, "formula": "not scored", "fps_normalisation": None,
                                         "quality_floor": {}, "rows": rest}))
    floor = board.get("quality_floor") if isinstance(board.get("quality_floor"), dict) else {}
    if tables and floor.get("rule"):
        console.print(Text(f"quality floors: {floor['rule']}"), highlight=False)
    if board.get("warning"):
        console.print(Text(f"warning: {board['warning']}", style="yellow"))


def pipe_console() -> Console:
    """stdout; under a pipe 200 columns wide (rich's 80 would cut the scores to `0.56…`)."""
    return Console(width=None if sys.stdout.isatty() else 200)
