"""Secrets never reach a run directory: credential-like variables and arguments are redacted.

What Musubi records for provenance (env.json, run.json, preflight.json, logs,
the registry's copy of env.json) passes through here first. A variable is a
secret when its name looks like a credential (TOKEN, KEY, SECRET, PASSWORD,
CREDENTIAL, AUTH, ...); its value is replaced by `REDACTED`. Passwords inside
URLs (`scheme://user:password@host`) are redacted wherever they appear, and
`scrub_text` removes the current values of secret variables from free text
(log lines), so a token echoed by a library does not land in a log file.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "REDACTED"

#: Words that mark a secret anywhere in a name (HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, ...).
_ANYWHERE = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "PRIVATE", "COOKIE",
             "APIKEY", "ACCESSKEY", "SIGNATURE")
#: Words that mark a secret as a whole part of a name (WANDB_API_KEY, NGC_KEY, HTTP_AUTH, GITHUB_PAT, ...);
#: as parts only, so MUSUBI_AUTHOR or KEYBOARD_LAYOUT stay visible.
_PARTS = {"KEY", "KEYS", "AUTH", "AUTHORIZATION", "PAT", "PASS", "DSN"}
_URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/\s:@]*):(?P<pw>[^/\s@]+)@")
#: Values shorter than this are not scrubbed from free text (too likely to match ordinary words).
_MIN_SCRUB = 6


def is_secret_name(name: str) -> bool:
    """True when an environment variable or option name looks like it holds a credential."""
    upper = name.upper().lstrip("-")
    if any(word in upper for word in _ANYWHERE):
        return True
    parts = [p for p in re.split(r"[^A-Z0-9]+", upper) if p]
    return any(p in _PARTS or p.endswith("KEY") for p in parts)


def redact_url(text: str) -> str:
    """`scheme://user:password@host` -> `scheme://user:REDACTED@host` (anywhere in the text)."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with secret values replaced and URL passwords removed."""
    return {k: (REDACTED if is_secret_name(k) else redact_url(str(v))) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the values of secret-looking options (`--token X`, `--api-key=X`, `--set a.token=X`) redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" not in arg:
            hide_next = is_secret_name(arg)
            out.append(arg)
            continue
        key, eq, _ = arg.partition("=")
        if eq and is_secret_name(key.rsplit(".", 1)[-1]):
            out.append(f"{key}={REDACTED}")
        else:
            out.append(redact_url(arg))
    return out


def redact_tree(data: Any) -> Any:
    """A copy of JSON-like data with the values of secret-named keys redacted (mappings at any depth)."""
    if isinstance(data, Mapping):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and isinstance(v, (str, int, float))
                    else redact_tree(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_tree(v) for v in data]
    if isinstance(data, str):
        return redact_url(data)
    return data


def secret_values(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """{value: name} of the secret variables of `env` (default: this process) worth scrubbing from text."""
    env = os.environ if env is None else env
    return {v: k for k, v in env.items() if is_secret_name(k) and len(v) >= _MIN_SCRUB}


def scrub_text(text: str, secrets: Mapping[str, str] | None = None) -> str:
    """`text` without any secret variable's value (replaced by `REDACTED(NAME)`) and without URL passwords."""
    secrets = secret_values() if secrets is None else secrets
    for value, name in sorted(secrets.items(), key=lambda kv: -len(kv[0])):
        if value in text:
            text = text.replace(value, f"{REDACTED}({name})")
    return redact_url(text)


class ScrubFilter(logging.Filter):
    """A logging filter that scrubs secrets from each record's final message (attach to file handlers)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets = secret_values()

    def filter(self, record: logging.LogRecord) -> bool:
        """Render the message once, scrubbed; never drops a record."""
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logging's problem, not ours
            return True
        scrubbed = scrub_text(message, self.secrets)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True
