"""Secrets in a connection string: what pathprof may record and show of a DSN, and how the secret reaches the
processes that need it without passing through argv, a file of the run directory, a log line or an export.

A DSN's `password` (and `sslpassword`) is taken out: the rest of the DSN (host, port, user, dbname, sslmode,
paths such as passfile or sslkey) is kept, and the secret travels in the environment (PGPASSWORD /
PGSSLPASSWORD; libpq and psycopg read them, and /proc/PID/environ is readable by the process owner only, not by
every user as argv is). What is recorded is the DSN with the secret shown as ***."""
from __future__ import annotations

SECRET_KEYS = {"password": "PGPASSWORD", "sslpassword": "PGSSLPASSWORD"}
REDACTED = "***"


def _parse(dsn: str) -> dict:
    import psycopg
    from pathprof.errors import UserError
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise UserError(f"--dsn is not a valid connection string: {str(e).strip().splitlines()[0]}") from None


def _make(params: dict) -> str:
    import psycopg
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def split_secret(dsn: str) -> tuple[str, dict[str, str]]:
    """(the DSN without its secrets, the environment variables that carry them) for a child process."""
    params = _parse(dsn)
    env = {SECRET_KEYS[k]: str(params.pop(k)) for k in list(params) if k in SECRET_KEYS}
    return _make(params), env


def redact(dsn: str) -> str:
    """The DSN as pathprof records and shows it: every secret replaced by ***."""
    params = _parse(dsn)
    for k in SECRET_KEYS:
        if k in params:
            params[k] = REDACTED
    return _make(params)
