"""Keeping credentials out of what a sweep records.

Credentials reach a sweep through environment variables (AWS_SECRET_ACCESS_KEY,
HF_TOKEN, MLFLOW_TRACKING_PASSWORD, GOOGLE_APPLICATION_CREDENTIALS, ...). Neither those
variables nor their values may end up in an MLflow param, tag or artifact, and a
secret can travel under an innocent name: a tracking URI with a password in it, an
error message that quotes a connection string, a config value copied from the
environment. ``scrub`` is applied to everything SweepTracker writes, so it holds for
every sweep without each caller remembering it.

What counts as secret, decided here once:

- A name looks secret when one of its words is KEY, SECRET, TOKEN, PASSWORD, PASSWD or
  CREDENTIAL, or a plural of one (case-insensitive; words are split at ``_``, ``-``,
  ``.``, spaces and camelCase humps). Whole words only: KEYBOARD, MONKEY,
  TOKENIZERS_PARALLELISM and PWD (the working directory) are not secrets. Run-together
  names (APIKEY) are missed; write them with a separator.
- A secret-looking name is dropped only when its value is text: a credential is a
  string, while ``pad_token_id=0`` or ``max_tokens=512`` is a count that happens to
  share the word.
- A value is redacted wherever it contains the value of a secret-looking environment
  variable set now, or the password of a URI (``scheme://user:PASSWORD@host``).
  Values shorter than ``MIN_SECRET_CHARS`` are not hunted for: flags such as
  ``USE_AUTH_TOKEN=1`` would otherwise blank every "1" in the record.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping, Optional

SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL")
REDACTED = "<redacted>"
# NIST SP 800-63B's minimum length for a memorized secret; machine-issued keys and
# tokens are far longer (an AWS secret access key has 40 characters, an HF token 37).
MIN_SECRET_CHARS = 8

_WORD_BOUNDARY = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_SECRET_PARTS = frozenset(SECRET_WORDS) | {f"{word}S" for word in SECRET_WORDS}
# scheme://user:password@host: the password is everything between the first ':' after
# the user and the '@' that ends the authority.
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?P<password>[^@/\s]+)(?=@)")


def looks_secret(name: str) -> bool:
    """Whether a variable, param or tag name says it holds a credential."""
    return any(part.upper() in _SECRET_PARTS for part in _WORD_BOUNDARY.split(str(name)) if part)


def secret_values(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The values of the secret-looking environment variables set now, longest first
    (so a secret that contains a shorter one is redacted whole)."""
    environ = os.environ if environ is None else environ
    values = {value for name, value in environ.items() if looks_secret(name) and len(value) >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def redact_uri(uri: str) -> str:
    """``postgresql://user:pw@db/mlflow`` -> ``postgresql://user:<redacted>@db/mlflow``."""
    return _URI_PASSWORD.sub(lambda match: match.group("head") + REDACTED, uri)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return redact_uri(text)


def scrub(mapping: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """``mapping`` without its secret-looking text entries, every remaining value with
    the secrets it contains replaced by ``<redacted>``. Values that hold no secret keep
    their type (MLflow writes them as text later)."""
    secrets = secret_values(environ)
    clean = {}
    for key, value in mapping.items():
        if looks_secret(key) and isinstance(value, (str, bytes)) and value:
            continue
        text = value if isinstance(value, str) else str(value)
        redacted = redact_text(text, secrets)
        clean[key] = value if redacted == text else redacted
    return clean
