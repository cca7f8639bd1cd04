"""The one exception type for bad input: its message is a single actionable line."""


class ConfigError(ValueError):
    """A configuration, data or environment problem the user can fix; str() is one line."""
