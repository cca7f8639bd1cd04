"""The one exception type for bad input: its message is a single actionable line."""


class ConfigError(ValueError):
    """A configuration, data or environment problem the user can fix; str() is one line."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message squeezed to one line of at most `limit` characters (its type if empty)."""
    return (" ".join(str(e).split()) or type(e).__name__)[:limit]


def split_error(message: str) -> tuple[str, str]:
    """Split a ConfigError line 'path: problem; fix' into (problem, fix)."""
    head, sep, tail = message.rpartition("; ")
    return (head, tail) if sep else (message, "fix the dataset")
