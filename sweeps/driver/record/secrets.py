"""Keeping credentials out of what a sweep records.

Credentials reach a sweep through environment variables (AWS_SECRET_ACCESS_KEY, HF_TOKEN,
MLFLOW_TRACKING_PASSWORD, ...). Neither those variables nor their values may end up in an
MLflow param, tag or artifact, and a secret can travel under an innocent name: a tracking
URI with a password in it, an error message that quotes a connection string, a config
value copied from the environment. ``scrub`` is applied to everything SweepTracker writes,
so it holds for every sweep without each caller remembering it; what counts as secret is
decided here once (``looks_secret``, ``scrub``).

A tracking server's credentials are not kept in the URI at all (``credentials_to_environment``);
a database URI's password cannot move out (the URI is how SQLAlchemy gets it): it stays in
memory, what is pickled or written is ``redact_uri`` of it, and ``--resume`` reads the URI
from its flag again.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterable, Iterator, Mapping, Optional
from urllib.parse import unquote, urlsplit, urlunsplit
from accelsweep.trainables.environment_variables import environment_restored

SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL")
REDACTED = "<redacted>"
# NIST SP 800-63B's minimum length for a memorized secret; machine-issued keys and
# tokens are far longer (an AWS secret access key has 40 characters, an HF token 37).
MIN_SECRET_CHARS = 8

_WORD_BOUNDARY = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_SECRET_PARTS = frozenset(SECRET_WORDS) | {f"{word}S" for word in SECRET_WORDS}
# scheme://user:password@host: the password is everything between the first ':' after
# the user and the last '@' of the authority (a password with an unencoded '@' is one
# password, not a password and a host: urlsplit takes the last '@' too).
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?P<password>[^/\s]*)"
                           r"(?=@[^@/\s]*(?:[/?#\s]|$))")
# ?token=...&api_key=...: a query parameter whose name looks secret (looks_secret).
_QUERY_PARAMETER = re.compile(r"(?P<head>[?&;](?P<name>[^=&;#\s]+)=)(?P<value>[^&;#\s]*)")
# MLflow's own place for a tracking server's basic-auth credentials: read from the
# environment on every request (mlflow/utils/credentials.py, read_mlflow_creds and
# get_default_host_creds in MLflow 3.17), artifact uploads included.
MLFLOW_CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def looks_secret(name: str) -> bool:
    """Whether a variable, param or tag name says it holds a credential: one of its words
    is in SECRET_WORDS, or a plural of one (case-insensitive; words are split at ``_``,
    ``-``, ``.``, spaces and camelCase humps). Whole words only: KEYBOARD, MONKEY,
    TOKENIZERS_PARALLELISM and PWD (the working directory) are not secrets. Run-together
    names (APIKEY) are missed; write them with a separator."""
    return any(part.upper() in _SECRET_PARTS for part in _WORD_BOUNDARY.split(str(name)) if part)


def secret_values(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The values of the secret-looking environment variables set now, longest first
    (so a secret that contains a shorter one is redacted whole)."""
    environ = os.environ if environ is None else environ
    values = {value for name, value in environ.items() if looks_secret(name) and len(value) >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def redact_uri(uri: str) -> str:
    """``postgresql://user:pw@db/mlflow`` -> ``postgresql://user:<redacted>@db/mlflow``;
    ``http://host/?token=abc&x=1`` -> ``http://host/?token=<redacted>&x=1``. Any text
    may be passed: every URI in it is redacted."""
    text = _URI_PASSWORD.sub(lambda match: match.group("head") + REDACTED, uri)
    return _QUERY_PARAMETER.sub(lambda match: match.group("head") + REDACTED
                                if looks_secret(match.group("name")) and match.group("value") else match.group(0), text)


def redact_command_line(argv: Iterable[str]) -> list[str]:
    """A command line as it may be shown to others (Ray's job table): every URI as
    ``shown_uri`` shows it, and the value of a flag whose name looks secret
    (``--api-token X``, ``--db-password=X``) redacted."""
    shown: list[str] = []
    secret_flag = False
    for argument in argv:
        if secret_flag and not argument.startswith("-"):
            shown.append(REDACTED)
            secret_flag = False
            continue
        secret_flag = False
        if argument.startswith("-") and looks_secret(argument.lstrip("-").split("=", 1)[0]):
            name, has_value, _ = argument.partition("=")
            if has_value:
                shown.append(f"{name}={REDACTED}")
            else:
                shown.append(argument)
                secret_flag = True
            continue
        shown.append(shown_uri(argument))
    return shown


def redact_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return redact_uri(text)


def scrub(mapping: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """``mapping`` without its secret-looking text entries, every remaining value with
    the secrets it contains replaced by ``<redacted>``. Values that hold no secret keep
    their type (MLflow writes them as text later).

    A secret-looking name is dropped only when its value is text: a credential is a
    string, while ``pad_token_id=0`` or ``max_tokens=512`` is a count that happens to
    share the word. A value is redacted wherever it contains the value of a
    secret-looking environment variable set now (at least MIN_SECRET_CHARS long: flags
    such as ``USE_AUTH_TOKEN=1`` would otherwise blank every "1" in the record), or the
    password of a URI (``scheme://user:PASSWORD@host``)."""
    secrets = secret_values(environ)
    clean = {}
    for key, value in mapping.items():
        if looks_secret(key) and isinstance(value, (str, bytes)) and value:
            continue
        text = value if isinstance(value, str) else str(value)
        redacted = redact_text(text, secrets)
        clean[key] = value if redacted == text else redacted
    return clean


def split_http_credentials(uri: str) -> tuple[str, Optional[str], Optional[str]]:
    """``https://user:p%40ss@host:5000/x`` -> (``https://host:5000/x``, ``user``, ``p@ss``);
    a URI of another scheme, or without credentials, comes back as it is, with None, None."""
    parsed = urlsplit(uri)
    if parsed.scheme.lower() not in ("http", "https") or "@" not in parsed.netloc:
        return uri, None, None
    userinfo, _, host = parsed.netloc.rpartition("@")
    user, has_password, password = userinfo.partition(":")
    return (urlunsplit(parsed._replace(netloc=host)), unquote(user) or None,
            unquote(password) if has_password else None)


def shown_uri(uri: str) -> str:
    """A URI as it may be written or printed anywhere: no http(s) credentials, any other
    password ``<redacted>``."""
    return redact_uri(split_http_credentials(uri)[0])


def credentials_to_environment(uri: str) -> str:
    """``uri`` without its http(s) credentials, which are set as MLFLOW_TRACKING_USERNAME
    and MLFLOW_TRACKING_PASSWORD in this process's environment for MLflow to send (over
    any value there: the URI given is the one asked for); the URI the tool keeps, pickles
    (Tune's experiment state), writes and prints is the bare server address. A sweep puts the variables back
    as they were when it ends (``mlflow_credentials_restored``). Other URIs come back as
    they are."""
    bare, user, password = split_http_credentials(uri)
    for name, value in zip(MLFLOW_CREDENTIAL_VARIABLES, (user, password)):
        if value is not None:
            os.environ[name] = value
    return bare


@contextlib.contextmanager
def mlflow_credentials_restored() -> Iterator[None]:
    """MLflow's credential variables as they were before, whatever ``credentials_to_environment``
    set meanwhile."""
    with environment_restored(MLFLOW_CREDENTIAL_VARIABLES):
        yield


@contextlib.contextmanager
def mlflow_credentials_hidden() -> Iterator[None]:
    """MLflow's credential variables out of this process's environment for a while: a local
    Ray instance started meanwhile (its raylet, and every worker it forks later) inherits
    none of them. Trials never talk to MLflow; only the driver does."""
    with mlflow_credentials_restored():
        for name in MLFLOW_CREDENTIAL_VARIABLES:
            os.environ.pop(name, None)
        yield
