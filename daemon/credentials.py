"""Credentials that expire: a token from an operator-configured program, cached until near expiry.

A profile's ``[credential] command = ["/abs/prog", "arg", ...]`` (the convention of kubectl's
exec credential plugins and AWS's ``credential_process``) names a program bide runs, without a
shell, with ``argv`` as given, in ``/``, with stdin from ``/dev/null`` and a clean environment
(``PATH=/usr/local/bin:/usr/bin:/bin``, ``LANG=C.UTF-8``, plus the profile's ``env`` table). It
prints one JSON object on stdout, one of:

    {"token": "T", "expires_at": "2026-12-07T06:00:00Z"}   RFC 3339, with an offset or Z
    {"token": "T", "expires_in": 3600}                      seconds from now
    {"token": "T"}                                          no expiry: cached cache_seconds
    {"kind": "ExecCredential", "status": {"token": "T", "expirationTimestamp": "..."}}

(the last is kubectl's ``ExecCredential``: ``status.token`` is the token and
``status.expirationTimestamp`` its ``expires_at``). AWS ``credential_process`` output
(``AccessKeyId``/``SecretAccessKey``) is keys for request signing, not a token, and is refused.

The token is cached until ``expiry_skew_seconds`` before it expires (a token without expiry for
``cache_seconds``), or until the provider answers 401 to it; one run at a time per profile, and
every request that needs the token meanwhile waits for that run's result, good or bad. The run
is bounded by ``timeout_seconds`` (and by the waiting request's own time budget), its stdout by
:data:`MAX_OUTPUT`; the whole process group is killed when either bound is hit. Any failure is a
:class:`CredentialError`, which the HTTP shell records as a ``not_sent`` transport failure of
that request (counted in the transport-failure budget), never a job failure. Neither the token
nor stdout is ever logged or put in an error; of stderr only its length is told (a program may
echo the token there).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime

import anyio
import anyio.abc
import msgspec

from daemon import logfmt
from daemon.profile import CredentialRef
from daemon.secretfiles import CredentialError

MAX_OUTPUT = 64 * 1024  # bytes of stdout read from the program; more is a failure
MAX_TOKEN = 16 * 1024  # bytes of token sent as a header value
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass
class _Run:
    """One run of the program, shared by every request that waits for it."""

    done: anyio.Event = field(default_factory=anyio.Event)
    token: str | None = None
    error: CredentialError | None = None


class CommandCredential:
    """The token a profile's credential command prints, cached until shortly before expiry."""

    def __init__(self, provider: str, ref: CredentialRef) -> None:
        assert ref.command
        self.argv = list(ref.command)
        self.provider = provider
        self.ref = ref
        self.runs = 0  # programs started (for tests and metrics)
        self._cached: tuple[str, float] | None = None  # token, monotonic time it is good until
        self._running: _Run | None = None

    async def token(self, budget: float) -> str:
        """The token: cached, or from a run (this request's or one already under way), given
        at most ``budget`` seconds. Raises :class:`CredentialError`."""
        cached = self._cached
        if cached is not None and time.monotonic() < cached[1]:
            return cached[0]
        run = self._running
        if run is not None:
            with anyio.move_on_after(budget):
                await run.done.wait()
            if not run.done.is_set():
                raise CredentialError(self._name(f"did not answer within {budget:.3g}s"))
        else:
            run = self._running = _Run()
            try:
                run.token = await self._fetch(min(self.ref.timeout_seconds, budget))
            except CredentialError as exc:
                run.error = exc
                logfmt.warn("credential command failed", provider=self.provider, error=exc)
            finally:
                if run.token is None and run.error is None:  # cancelled (shutdown)
                    run.error = CredentialError(self._name("was stopped before it answered"))
                self._running = None
                run.done.set()
        if run.error is not None:
            raise run.error
        assert run.token is not None
        return run.token

    def forget(self) -> None:
        """Drop the cached token (the provider refused it: revoked before its expiry), so the
        next request runs the program again."""
        self._cached = None

    def _name(self, what: str) -> str:
        return f"credential command {self.argv[0]} for provider {self.provider} {what}"

    async def _fetch(self, limit: float) -> str:
        out, code, err_size = await self._run(limit)
        if code != 0:
            raise CredentialError(
                self._name(
                    f"exited with status {code} (stderr: {err_size} bytes, not logged as it "
                    f"could hold the token)"
                )
            )
        token, expires_in = self._parse(out)
        now = time.monotonic()
        if expires_in is None:
            self._cached = (token, now + self.ref.cache_seconds)
        elif expires_in - self.ref.expiry_skew_seconds > 0:
            self._cached = (token, now + expires_in - self.ref.expiry_skew_seconds)
        else:
            self._cached = None  # good now, but too close to expiry to keep: run again next time
        return token

    async def _run(self, limit: float) -> tuple[bytes, int, int]:
        """(stdout, exit status, stderr size) of one run within ``limit`` seconds."""
        self.runs += 1
        try:
            process = await anyio.open_process(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                env={**CLEAN_ENV, **self.ref.env},
                start_new_session=True,  # its own process group, killed as one
            )
        except OSError as exc:
            raise CredentialError(self._name(f"could not start: {exc.strerror}")) from None
        out = bytearray()
        err_size = 0
        finished = False

        async def read_out(stream: anyio.abc.ByteReceiveStream) -> None:
            async for chunk in stream:
                out.extend(chunk)
                if len(out) > MAX_OUTPUT:
                    scope.cancel()
                    return

        async def read_err(stream: anyio.abc.ByteReceiveStream) -> None:
            nonlocal err_size
            async for chunk in stream:
                err_size += len(chunk)

        try:
            with anyio.move_on_after(limit) as scope:
                assert process.stdout is not None
                assert process.stderr is not None
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_out, process.stdout)
                    tg.start_soon(read_err, process.stderr)
                code = await process.wait()
                finished = True
        finally:
            with anyio.CancelScope(shield=True):
                if not finished:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
                await process.aclose()
        if len(out) > MAX_OUTPUT:
            raise CredentialError(self._name(f"printed more than {MAX_OUTPUT} bytes; killed"))
        if not finished:
            raise CredentialError(self._name(f"did not finish within {limit:.3g}s; killed"))
        return bytes(out), code, err_size

    def _parse(self, out: bytes) -> tuple[str, float | None]:
        """(token, seconds until it expires or None). Errors never quote the output."""
        try:
            doc = msgspec.json.decode(out)
        except msgspec.DecodeError:
            raise CredentialError(self._name("printed something that is not JSON")) from None
        if not isinstance(doc, dict):
            raise CredentialError(self._name("printed JSON that is not an object"))
        if isinstance(doc.get("status"), dict) and doc.get("kind") == "ExecCredential":
            status = doc["status"]
            token, expires_at, expires_in = (
                status.get("token"),
                status.get("expirationTimestamp"),
                None,
            )
        elif "AccessKeyId" in doc:
            raise CredentialError(
                self._name(
                    "printed AWS keys (credential_process output), not a token; a profile "
                    'sends a token: print {"token": ..., "expires_at": ...}'
                )
            )
        else:
            token, expires_at, expires_in = (
                doc.get("token"),
                doc.get("expires_at"),
                doc.get("expires_in"),
            )
        return _check_token(self, token), _remaining(self, expires_at, expires_in)


def _check_token(credential: CommandCredential, token: object) -> str:
    if not isinstance(token, str) or not token.strip():
        raise CredentialError(credential._name('printed no "token" (a non-empty string)'))
    raw = token.encode("utf-8", "surrogatepass")
    bad = next((i for i, byte in enumerate(raw) if not 0x20 <= byte <= 0x7E), None)
    if bad is not None:
        raise CredentialError(
            credential._name(
                f"printed a token with a byte that cannot be sent in a header (a control "
                f"character or non-ASCII, at offset {bad})"
            )
        )
    if len(raw) > MAX_TOKEN:
        raise CredentialError(credential._name(f"printed a token over {MAX_TOKEN} bytes"))
    return token.strip()


def _remaining(
    credential: CommandCredential, expires_at: object, expires_in: object
) -> float | None:
    """Seconds the token is good for from now (None: it says no expiry); refuses an expired
    token or an expiry that does not parse."""
    if expires_at is not None and expires_in is not None:
        raise CredentialError(credential._name("printed both expires_at and expires_in"))
    if expires_in is not None:
        if (
            isinstance(expires_in, bool)
            or not isinstance(expires_in, int | float)
            or not math.isfinite(expires_in)
        ):
            raise CredentialError(credential._name("printed an expires_in that is not seconds"))
        seconds = float(expires_in)
    elif expires_at is not None:
        when = None
        if isinstance(expires_at, str):
            with contextlib.suppress(ValueError):
                when = datetime.fromisoformat(expires_at)
        if when is None or when.tzinfo is None:
            raise CredentialError(
                credential._name(
                    "printed an expires_at that is not an RFC 3339 time with an offset "
                    "(2026-12-07T06:00:00Z)"
                )
            )
        seconds = when.timestamp() - time.time()
    else:
        return None
    if seconds <= 0:
        raise CredentialError(credential._name("printed a token that has already expired"))
    return seconds
