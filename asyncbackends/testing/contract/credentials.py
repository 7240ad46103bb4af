"""`CredentialsContract`: a credential shows in no repr, error, cause, log record, or plain attribute.

Errors and logs end up in CI output, bug reports and shared notebooks; a backend's attributes end up in
debuggers, pickles and ``repr(vars(backend))``. A credential belongs in `ab.Secret` and leaves it only where
the request is sent.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Iterator, Sequence

import pytest

from ..._protocol import AsyncBackend
from ..._types import GenerationRequest, LoglikelihoodRequest, Request, SamplingParams
from ._base import ContractBase, added_in, expect
from ._inspect import held_secrets, plain_credentials
from .lifecycle import unsupported_requests

__all__ = ["CredentialsContract"]

_MAX_CHAIN = 32


def _chain(error: BaseException) -> Iterator[tuple[str, BaseException]]:
    """The error, its ``__cause__``/``__context__`` chain and group members, each with how it was reached."""
    seen: set[int] = set()
    pending: list[tuple[str, BaseException]] = [("", error)]
    while pending and len(seen) < _MAX_CHAIN:
        how, current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield how, current
        for link in ("__cause__", "__context__"):
            linked = getattr(current, link)
            if isinstance(linked, BaseException):
                pending.append((f"{how} {link}", linked))
        if isinstance(current, BaseExceptionGroup):
            pending.extend((f"{how} .exceptions[{i}]", e) for i, e in enumerate(current.exceptions))


def _error_views(error: BaseException) -> Iterator[tuple[str, str]]:
    for how, link in _chain(error):
        name = type(link).__qualname__
        yield f"{how} {name} str".strip(), str(link)
        yield f"{how} {name} repr".strip(), repr(link)
        yield f"{how} {name} args".strip(), repr(link.args)
        for note in getattr(link, "__notes__", ()):
            yield f"{how} {name} note".strip(), str(note)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _record_views(record: logging.LogRecord) -> Iterator[tuple[str, str]]:
    where = f"log record {record.name!r} {record.levelname}"
    try:
        yield where, record.getMessage()
    except Exception:  # a record whose arguments do not fit its format: scan its parts
        yield where, f"{record.msg!r} {record.args!r}"
    if record.exc_info and record.exc_info[1] is not None:
        yield f"{where} traceback", "".join(traceback.format_exception(record.exc_info[1]))


class CredentialsContract(ContractBase):
    """Where a credential must never show: reprs, fingerprint, errors and their causes, logs, plain state."""

    def test_no_secret_in_repr(self, backend: AsyncBackend, secret: str | None) -> None:
        """No credential shows in the repr of the backend or its vars, its str, or its fingerprint."""
        secrets = [s for s in (secret, *held_secrets(backend)) if s]
        if not secrets:
            pytest.skip(
                "no secret fixture given and the backend holds no ab.Secret: give `secret` (the credential "
                "the backend was built with) to check"
            )
        views = {
            "repr(vars(backend))": repr(vars(backend)),
            "repr(backend)": repr(backend),
            "str(backend)": str(backend),
        }
        if hasattr(type(backend), "fingerprint"):
            views["fingerprint"] = json.dumps(backend.fingerprint, sort_keys=True, default=str)  # type: ignore[attr-defined]
        leaks = [where for where, text in views.items() for value in secrets if value in text]
        expect(not leaks, f"a secret appears in {', '.join(sorted(set(leaks)))}: hold it in ab.Secret")

    @added_in(2)
    def test_credentials_held_in_secret(self, backend: AsyncBackend, secret: str | None) -> None:
        """Credentials the backend keeps (headers, URL userinfo, options) are held in `ab.Secret`."""
        found = plain_credentials(backend, [secret] if secret else [])
        expect(
            not found,
            "credentials held outside ab.Secret (debuggers, pickles and repr(vars(...)) show them):\n  "
            + "\n  ".join(found)
            + "\nhold each in ab.Secret and call get_secret_value() only where the request is sent "
            "(split a URL's user:password@ off into a Secret)",
        )

    @added_in(2)
    def test_no_secret_in_errors_or_logs(
        self,
        backend: AsyncBackend,
        failing_backend: Callable[[], AsyncBackend] | None,
        rejected_requests: Sequence[Request],
        prompts: Sequence[str],
        secret: str | None,
    ) -> None:
        """Refused and failed requests leak no credential: not in any error, its causes, or the logs."""
        secrets = {s for s in (secret, *held_secrets(backend)) if s}
        cases: list[tuple[str, AsyncBackend, Request]] = [
            (f"refused ({why})", backend, request)
            for why, request in unsupported_requests(backend.capabilities, prompts[0])
        ]
        cases += [(f"rejected_requests[{i}]", backend, r) for i, r in enumerate(rejected_requests)]
        broken = failing_backend() if failing_backend is not None else None
        try:
            if broken is not None:
                secrets.update(s for s in held_secrets(broken) if s)
                cases.append(
                    (
                        "generate on failing_backend",
                        broken,
                        GenerationRequest(prompts[0], SamplingParams(max_tokens=4), request_id="leak"),
                    )
                )
                if broken.capabilities.loglikelihood:
                    request = LoglikelihoodRequest(prompts[0], " x", request_id="leak-ll")
                    cases.append(("loglikelihood on failing_backend", broken, request))
            if not secrets:
                pytest.skip(
                    "no secret fixture given and the backend holds no ab.Secret: give `secret` (the "
                    "credential the backend was built with) to check errors and logs"
                )
            records, errors = self._drive(cases)
        finally:
            if broken is not None:
                self.call(broken.aclose())
        if not errors:
            pytest.skip(
                "no request failed to look at: give failing_backend (a backend pointed at nothing) or "
                "rejected_requests"
            )
        leaks = [
            f"{what}: {where}"
            for what, error in errors
            for where, text in _error_views(error)
            if any(s in text for s in secrets)
        ]
        leaks += [
            f"while driving errors: {where}"
            for record in records
            for where, text in _record_views(record)
            if any(s in text for s in secrets)
        ]
        expect(
            not leaks,
            "the credential appears in:\n  "
            + "\n  ".join(dict.fromkeys(leaks))
            + "\nerrors and logs reach CI output and bug reports: never put headers, tokens or the options "
            "a backend was built with into a message, a chained exception or a log record",
        )

    def _drive(
        self, cases: Sequence[tuple[str, AsyncBackend, Request]]
    ) -> tuple[list[logging.LogRecord], list[tuple[str, BaseException]]]:
        """Send each case, capturing every log record (DEBUG and up); the errors raised, with their case."""
        handler = _Records()
        root = logging.getLogger()
        level = root.level
        root.addHandler(handler)
        root.setLevel(logging.DEBUG)
        errors: list[tuple[str, BaseException]] = []
        try:
            for what, target, request in cases:
                _, error = self.outcome(target, request)
                if error is not None:
                    errors.append((what, error))
        finally:
            root.setLevel(level)
            root.removeHandler(handler)
        return handler.records, errors
