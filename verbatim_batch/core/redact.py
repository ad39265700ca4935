"""Secrets are never recorded: credentials in URLs and headers are redacted from what a run writes.

``redact`` replaces a URL's user info, secret query parameters (``?api-key=``, ``X-Amz-Signature=``) and fragment
(``#access_token=``), and an ``Authorization`` header, with ``REDACTED``, in a string or every string of a JSON-like
value, so manifests, reports and logs keep where a run read from, never how it got in (settings such as ``region``
stay). ``install_log_redaction`` passes this package's log records through it.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import quote, unquote

REDACTED = "REDACTED"
# query parameters that configure rather than authorise (storage URIs: ?region=eu-west-1&scheme=http)
KEPT_PARAMS = frozenset({"region", "scheme", "api-version", "api_version", "version", "endpoint_override",
                         "allow_bucket_creation", "allow_bucket_deletion", "format"})
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]{0,31}://)([^\s\"'<>`]*)")
_HEADER = re.compile(r"(?i)\b(authorization|proxy-authorization|x-api-key|api-key|cookie|set-cookie)"
                     r"(\s*[:=]\s*)(bearer\s+|basic\s+|token\s+)?([^\s\"',;&]+)")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/=\-]{8,})")
_SECRET_FIELD = re.compile(r"(?i)(\b(?:api[-_]?key|access[-_]?token|auth[-_]?token|secret|password|passwd|token|"
                           r"signature|sig|credential|session[-_]?token)[\"']?\s*[:=]\s*[\"']?)([^\s\"'&,;})\]]+)")


def _params(text: str, sep: str) -> str:
    """``k=v`` pairs of a query string or fragment with each value redacted, unless the key is a setting."""
    out = []
    for part in text.split(sep):
        key, eq, value = part.partition("=")
        if eq and value and unquote(key).lower() not in KEPT_PARAMS:
            value = REDACTED
        elif not eq and part and len(part) >= 16:  # a bare token (?eyJhbGci...): no name to tell, redacted
            key = REDACTED
        out.append(f"{key}{eq}{value}")
    return sep.join(out)


def redact_url(url: str) -> str:
    """``url`` with its user info, secret query values and fragment values replaced by ``REDACTED``."""
    match = _URL.match(url)
    if not match:
        return url
    scheme, rest = match.group(1), url[len(match.group(1)):]
    rest, hash_, fragment = rest.partition("#")
    rest, q, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = f"{quote(REDACTED)}@{netloc.rpartition('@')[2]}"
    query = _params(query, "&") if q else ""
    fragment = _params(fragment, "&") if hash_ and "=" in fragment else (REDACTED if hash_ and len(fragment) >= 16
                                                                         else fragment)
    return f"{scheme}{netloc}{slash}{path}{q}{query}{hash_}{fragment}"


def _url_in_text(match: re.Match) -> str:
    """A URL found in prose, less the punctuation that ends its sentence."""
    url = match.group(0)
    core = url.rstrip(".,;:)]}!")
    return redact_url(core) + url[len(core):]


def redact_text(text: str) -> str:
    """Every URL in ``text`` through ``redact_url``; header values and ``key=secret`` pairs replaced."""
    if not text or ("://" not in text and not _HEADER.search(text) and not _SECRET_FIELD.search(text)
                    and not _BEARER.search(text)):
        return text
    text = _URL.sub(_url_in_text, text)
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3) or ''}{REDACTED}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _SECRET_FIELD.sub(lambda m: m.group(0) if m.group(2).startswith(REDACTED) else f"{m.group(1)}{REDACTED}",
                             text)


def redact(value: Any) -> Any:
    """``value`` with ``redact_text`` applied to every string in it (dict keys, list items, nested)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact(k): redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value


class _RedactingRecords:
    """A log record factory: records of this package's loggers get their message redacted."""

    def __init__(self, factory) -> None:
        self.factory = factory

    def __call__(self, *args, **kwargs) -> logging.LogRecord:
        record = self.factory(*args, **kwargs)
        if record.name.startswith("verbatim_batch"):
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001 - a bad format string is logging's to report
                return record
            redacted = redact_text(message)
            if redacted != message:
                record.msg, record.args = redacted, ()
        return record


def install_log_redaction() -> None:
    """Redact every log record of ``verbatim_batch.*`` loggers (once per process; other loggers untouched)."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _RedactingRecords):
        logging.setLogRecordFactory(_RedactingRecords(factory))
