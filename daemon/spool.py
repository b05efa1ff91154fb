"""The spool: how other processes talk to the daemon, through files.

    spool/incoming/    registrations dropped by `bide watch` (3730, the agents' group)
    spool/decisions/   decisions dropped by `bide decide` (3730, the approvers' group)
    spool/rejected/    files the daemon refused, each with NAME.reason beside it (the newest
                       [spool] rejected_max_files are kept)
    spool/receipts/    REQUEST_ID.json: what became of each incoming file, kept [spool]
                       receipt_retention_seconds (and at most receipt_max_files of them);
                       readable by the daemon and the user who dropped the request alone
    spool/decided/     the same for decision files

Writers drop a file atomically (a dot-file in the same directory, fsync, rename) so the daemon
never reads half a file. The daemon reads each file with ``O_NOFOLLOW`` and a size cap,
validates it, appends the event, writes the receipt, and only then deletes the file: a crash in
between leaves the file to be read again, and ingest is idempotent (the operation id is fixed
by the file, and an id already in the log is not registered twice).

The role directories are setgid, so a dropped file takes the role's group (which the daemon's
user is in) whatever the writer's primary group; the writer makes it 0640 whatever its umask,
and checks that the daemon's user could open it before the rename: a file the daemon could not
read is never reported as queued.

A receipt is the daemon's file, 0600, with a POSIX ACL entry that lets the user who dropped
the request read it: the daemon cannot give a file to another user (no ``CAP_CHOWN``, and the
unit's system call filter forbids ``chown``), but the owner of a file may set its ACL, so an
agent reads its own receipts and no other agent does.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import secrets
import stat
import struct
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from daemon import logfmt
from daemon.errors import Refused, UsageError
from eventlog.fsync import fsync_dir
from replay.observations import Registration

SPOOL_VERSION = 1
MAX_FILE_BYTES = 512 * 1024  # a submit body (at most 256 KiB) base64-encoded, with room
REQUEST_ID = Annotated[str, Meta(pattern=r"^[0-9a-f]{32}$")]


class RegistrationFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``bide watch``: register a job that was already submitted."""

    version: Literal[1]
    request_id: REQUEST_ID
    registration: Registration
    kind: Literal["watch"] = "watch"


class SubmitFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``bide submit``: let the daemon make the submit call, then watch the job.

    ``registration`` carries the deadline and budgets; its ``provider_job_id`` is filled from
    the provider's answer.
    """

    version: Literal[1]
    request_id: REQUEST_ID
    kind: Literal["submit"]
    registration: Registration
    body: bytes
    #: Sent as a header value: visible ASCII only, so it can never break the request.
    idempotency_key: Annotated[str, Meta(pattern=r"^[\x21-\x7e]{1,256}$")] | None = None
    force: bool = False


class FetchFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``bide fetch``: download a succeeded operation's result."""

    version: Literal[1]
    request_id: REQUEST_ID
    kind: Literal["fetch"]
    operation_id: Annotated[str, Meta(min_length=1, max_length=256)]
    result: Annotated[str, Meta(min_length=1, max_length=64)] | None = None


class _Kind(msgspec.Struct, frozen=True):
    kind: str = "watch"


IncomingFile = RegistrationFile | SubmitFile | FetchFile
_INCOMING: dict[str, type[IncomingFile]] = {
    "watch": RegistrationFile,
    "submit": SubmitFile,
    "fetch": FetchFile,
}


def decode_incoming(data: bytes) -> IncomingFile:
    """Decode an incoming spool file of any kind; raises :class:`~daemon.errors.Refused`
    with the reason."""
    try:
        kind = msgspec.json.decode(data, type=_Kind).kind
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Refused(f"not a valid spool file: {exc}") from None
    cls = _INCOMING.get(kind)
    if cls is None:
        raise Refused(f"unknown kind {kind[:32]!r} (known: {', '.join(_INCOMING)})")
    try:
        request = msgspec.json.decode(data, type=cls)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Refused(f"not a valid {kind} request: {exc}") from None
    if (
        isinstance(request, RegistrationFile | SubmitFile)
        and request.registration.status_location is not None
    ):
        raise Refused(
            "the registration names a status_location: agents give a provider and a job id, "
            "never a URL; only the provider's profile decides where bide sends its requests "
            "and its credential"
        )
    return request


DOTS = (".", "..")


class DecisionFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    version: Literal[1]
    request_id: REQUEST_ID
    operation_id: Annotated[str, Meta(min_length=1, max_length=256)]
    option: Annotated[str, Meta(min_length=1, max_length=64)]
    note: Annotated[str, Meta(max_length=4096)] = ""
    escalation_id: int | None = None


class Receipt(msgspec.Struct, frozen=True):
    """What became of a spool file; written by the daemon, read by the command that dropped it."""

    request_id: str
    status: Literal["registered", "recorded", "rejected", "escalated", "fetched", "failed"]
    operation_id: str | None = None
    reason: str = ""
    action_id: str | None = None
    stored_as: str | None = None
    sha256: str | None = None
    size: int | None = None


def new_request_id() -> str:
    return secrets.token_hex(16)


class Spool:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.incoming = root / "incoming"
        self.decisions = root / "decisions"
        self.rejected = root / "rejected"
        self.receipts = root / "receipts"
        self.decided = root / "decided"
        self.rejected_since_prune = 0
        #: Who dropped each request the daemon read (request id -> uid): its receipt's reader.
        self.owners: dict[str, int] = {}
        self._acl_warned = False

    def layout(
        self, agents_group: str = "", approvers_group: str = ""
    ) -> tuple[tuple[Path, int, str], ...]:
        """(directory, mode, group) of the spool; group "" is the daemon's own.

        A role directory is setgid: a file dropped there takes the role's group, which the
        daemon's user is in, whatever the writer's own primary group, so the daemon can open
        it (0640). It is sticky too: a member cannot remove or replace another's file.
        Receipts directories need no setgid bit: a receipt is readable through its ACL by the
        one user who asked, never through its group.
        """

        def role(group: str) -> int:
            return 0o3730 if group else 0o730  # sticky: no one removes another's file

        return (
            (self.root, 0o755, ""),
            (self.incoming, role(agents_group), agents_group),
            (self.decisions, role(approvers_group), approvers_group),
            (self.rejected, 0o750, ""),
            (self.receipts, 0o750, agents_group),
            (self.decided, 0o750, approvers_group),
        )

    def create(self, agents_group: str = "", approvers_group: str = "") -> None:
        """Make the directories with their modes (the umask is ignored), and hand
        ``incoming/`` to the agents' group and ``decisions/`` to the approvers' group.

        Then refuse a decisions directory that anyone but the approvers could write to.
        """
        for group in {agents_group, approvers_group} - {""}:
            _check_member(group)
        for d, mode, group in self.layout(agents_group, approvers_group):
            try:
                if not d.exists():
                    d.mkdir(parents=True)
                    os.chmod(d, mode)
                if group and d.stat().st_gid != _gid(group):
                    os.chown(d, -1, _gid(group))
                    os.chmod(d, mode)  # a change of group clears the setgid bit
            except PermissionError:
                raise SpoolPermissionError(
                    f"{d} must exist with mode {mode:04o}"
                    + (f" and group {group}" if group else "")
                    + ", and this process may not set that up (under the shipped unit the "
                    f"system call filter forbids chown and setgid bits): create it beforehand, "
                    f"e.g. install -d -m {mode:04o}"
                    + (f" -g {group}" if group else "")
                    + f" {d} (the shipped unit does so in ExecStartPre=+)"
                ) from None
            if mode & stat.S_ISGID and not d.stat().st_mode & stat.S_ISGID:
                _make_setgid(d, mode, group)
        self.check_decisions(agents_group)

    def check_decisions(self, agents_group: str = "") -> None:
        """Refuse a decisions directory someone besides the approvers could write to: checked
        at start and again before every scan (a ``chmod`` after start is seen)."""
        st = self.decisions.stat()
        mode = stat.S_IMODE(st.st_mode)
        acl = _acl_grants(self.decisions)
        if acl:
            raise SpoolPermissionError(
                f"decisions directory {self.decisions} carries a POSIX ACL ({acl}): users "
                f"outside the approvers' group may write there. Fix: setfacl -b -k "
                f"{self.decisions}"
            )
        if mode & 0o002:
            raise SpoolPermissionError(
                f"decisions directory {self.decisions} is world-writable (mode {mode:04o}): "
                f"anyone could approve. Fix: chmod 0730 {self.decisions}"
            )
        if agents_group and mode & 0o020 and st.st_gid == _gid(agents_group):
            raise SpoolPermissionError(
                f"decisions directory {self.decisions} is writable by the agents' group "
                f"{agents_group}: agents could approve their own escalations. Fix: chgrp "
                f"APPROVERS {self.decisions} (or set [spool] approvers_group)"
            )

    # -- writers (CLI side) -----------------------------------------------------------------

    def drop(self, directory: Path, request_id: str, data: bytes) -> Path:
        if not directory.is_dir():
            raise FileNotFoundError(
                errno.ENOENT,
                f"spool directory {directory} does not exist (has `bide run` "
                f"started once with this config?)",
            )
        final = directory / f"{request_id}.json"
        tmp = directory / f".{request_id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
        try:
            try:
                _readable_by_the_daemon(fd, directory)
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()  # never leave behind a file nobody will take
            raise
        os.rename(tmp, final)
        # An agent may write into spool/incoming (3730) but not open it to fsync: the file
        # itself is durable, its name is the daemon's to make durable, and the daemon takes it
        # the moment it sees it. Failing here would tell the agent "not registered" about a
        # file the daemon registers anyway (and its retry would register the job twice).
        with contextlib.suppress(PermissionError):
            fsync_dir(directory)
        return final

    def request(self, directory: Path, request_id: str, data: bytes, *, who: str = "") -> None:
        """``drop`` for the commands: a failure is a usage error naming the directory."""
        try:
            self.drop(directory, request_id, data)
        except SpoolUnreadable as exc:
            raise UsageError(f"not queued: {exc}") from None
        except OSError as exc:
            hint = f" ({who})" if who else ""
            raise UsageError(
                f"cannot write to the spool {directory}: {exc.strerror}{hint}"
            ) from None

    def receipt_path(self, request_id: str, *, decision: bool = False) -> Path:
        return (self.decided if decision else self.receipts) / f"{request_id}.json"

    def read_receipt(self, request_id: str, *, decision: bool = False) -> Receipt | None:
        try:
            return msgspec.json.decode(
                self.receipt_path(request_id, decision=decision).read_bytes(), type=Receipt
            )
        except (OSError, msgspec.DecodeError):
            return None

    # -- daemon side -----------------------------------------------------------------------

    def pending(self, directory: Path) -> list[Path]:
        """Files waiting in ``directory``, oldest first; dot-files are writes in progress."""
        try:
            entries = [p for p in directory.iterdir() if not p.name.startswith(".")]
        except FileNotFoundError:
            return []
        entries = [p for p in entries if not p.name.endswith(".reason")]
        entries.sort(key=lambda p: (_mtime(p), p.name))
        return entries

    def read(self, path: Path) -> tuple[bytes, os.stat_result]:
        """(content, status) of a spool file; refuses links, non-files and large files.

        Remembers who owns it, whatever the outcome: its receipt is for that user's eyes."""
        rid = request_id_of(path)
        if rid is not None:
            with contextlib.suppress(OSError):
                self._remember(rid, os.lstat(path).st_uid)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Refused("a symbolic link; spool files must be regular files") from None
            raise Refused(f"cannot open: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused("not a regular file")
            if st.st_size > MAX_FILE_BYTES:
                raise Refused(f"{st.st_size} bytes; the limit is {MAX_FILE_BYTES}")
            data = os.read(fd, MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise Refused(f"more than {MAX_FILE_BYTES} bytes")
            return data, st
        finally:
            os.close(fd)

    def reject(
        self, path: Path, request_id: str | None, reason: str, *, decision: bool = False
    ) -> None:
        """Move ``path`` to ``rejected/`` with NAME.reason beside it, and write the receipt."""
        self.rejected.mkdir(parents=True, exist_ok=True)
        target = self.rejected / path.name
        while target.exists() or target.is_symlink():
            target = self.rejected / f"{path.stem}.{secrets.token_hex(3)}{path.suffix}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, target)
        reason_path = target.with_name(target.name + ".reason")
        reason_path.write_text(reason + "\n", encoding="utf-8")
        self.rejected_since_prune += 1
        if request_id is not None:
            self.write_receipt(Receipt(request_id, "rejected", None, reason), decision=decision)

    def _remember(self, rid: str, uid: int) -> None:
        self.owners.pop(rid, None)
        self.owners[rid] = uid
        while len(self.owners) > OWNERS_KEPT:
            del self.owners[next(iter(self.owners))]

    def write_receipt(
        self, receipt: Receipt, *, decision: bool = False, reader: int | None = None
    ) -> None:
        """Write ``receipt`` 0600, readable besides the daemon only by ``reader`` (by default
        the owner of the request file it answers, when this process read that file)."""
        if reader is None:
            reader = self.owners.get(receipt.request_id)
        final = self.receipt_path(receipt.request_id, decision=decision)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # left by a crash
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if reader is not None and reader not in (0, os.geteuid()):
                self._grant_read(fd, reader, final.parent)
            os.write(fd, msgspec.json.encode(receipt))
        finally:
            os.close(fd)
        os.rename(tmp, final)

    def _grant_read(self, fd: int, uid: int, directory: Path) -> None:
        try:
            os.setxattr(fd, "system.posix_acl_access", _read_acl(uid))
        except OSError as exc:
            if not self._acl_warned:
                self._acl_warned = True
                logfmt.warn(
                    "cannot give a receipt's reader access: the file system refuses "
                    "POSIX ACLs; receipts stay readable by the daemon alone (use the "
                    "local API, or mount the state directory with ACL support)",
                    directory=directory,
                    error=exc.strerror,
                )

    def prune(
        self, now: float, *, receipt_retention: float, receipt_max: int, rejected_max: int
    ) -> int:
        """Remove receipts older than ``receipt_retention`` seconds or past the newest
        ``receipt_max`` of their directory, and all but the newest ``rejected_max`` refused
        files (with their reasons). Returns how many were removed."""
        removed = 0
        for directory in (self.receipts, self.decided):
            entries = sorted(_entries(directory), key=lambda e: (e.stat().st_mtime, e.name))
            for n, entry in enumerate(entries):
                if (
                    n < len(entries) - receipt_max
                    or now - entry.stat().st_mtime > receipt_retention
                ):
                    removed += _unlink(Path(entry.path))
        refused = sorted(
            (e for e in _entries(self.rejected) if not e.name.endswith(".reason")),
            key=lambda e: (e.stat().st_mtime, e.name),
        )
        for entry in refused[: max(0, len(refused) - rejected_max)]:
            removed += _unlink(Path(entry.path))
            removed += _unlink(Path(entry.path + ".reason"))
        self.rejected_since_prune = 0
        return removed

    def done(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


OWNERS_KEPT = 100_000  # request owners remembered for their receipts (about 10 MB at most)

_ACL_VERSION = 2
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_ACL_UNDEFINED_ID = 0xFFFFFFFF


def _read_acl(uid: int) -> bytes:
    """``system.posix_acl_access`` for u::rw-,u:UID:r--,g::---,m::r--,o::--- (the kernel's
    xattr layout: a version, then (tag, perm, id) entries sorted by tag)."""
    entries = (
        (_ACL_USER_OBJ, 6, _ACL_UNDEFINED_ID),
        (_ACL_USER, 4, uid),
        (_ACL_GROUP_OBJ, 0, _ACL_UNDEFINED_ID),
        (_ACL_MASK, 4, _ACL_UNDEFINED_ID),
        (_ACL_OTHER, 0, _ACL_UNDEFINED_ID),
    )
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


class SpoolPermissionError(Exception):
    """The spool's permissions would let the wrong people write; the daemon refuses to start."""


class SpoolUnreadable(Exception):
    """A file about to be dropped is one the daemon's user could not open; not queued."""


def _readable_by_the_daemon(fd: int, directory: Path) -> None:
    """Make the file being dropped 0640 and of the directory's group, then check that the
    daemon's user (the directory's owner) can open it; :class:`SpoolUnreadable` says why not
    and what fixes it.

    A role directory is setgid, so the file has its group already; in one that is not (a spool
    made by an older unit), the writer gives the file the directory's group if it is in it."""
    os.fchmod(fd, 0o640)  # whatever the umask: the daemon reads through the group
    dir_st = os.stat(directory)
    st = os.fstat(fd)
    if st.st_gid != dir_st.st_gid:
        with contextlib.suppress(PermissionError):
            os.fchown(fd, -1, dir_st.st_gid)  # allowed into a group the writer is in
            st = os.fstat(fd)
    daemon_uid = dir_st.st_uid
    if daemon_uid == 0 or os.geteuid() == daemon_uid:
        return
    daemon = user_name(daemon_uid)
    try:
        entry = pwd.getpwuid(daemon_uid)
        daemon_groups = set(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except KeyError:
        daemon_groups = set()
    if st.st_gid in daemon_groups:
        return
    group, dir_group = _group_name(st.st_gid), _group_name(dir_st.st_gid)
    if st.st_gid == dir_st.st_gid:
        raise SpoolUnreadable(
            f"the daemon's user {daemon} (who owns {directory}) is not in group {group}, "
            f"which the files dropped there get: it could not open this one. Fix (an "
            f"administrator): usermod -aG {group} {daemon}, then restart the daemon"
        )
    raise SpoolUnreadable(
        f"the file would get group {group}, not {dir_group} (the group of {directory}): you "
        f"({user_name(os.geteuid())}) are not in {dir_group} and the directory is not setgid, "
        f"and the daemon's user {daemon} cannot read a file of group {group}. Fix (an "
        f"administrator): install -d -m 3730 -g {dir_group} {directory}, and usermod -aG "
        f"{dir_group} {user_name(os.geteuid())} if you should use it"
    )


def _make_setgid(directory: Path, mode: int, group: str) -> None:
    """Set a role directory's setgid bit, or warn: the writers give their files the
    directory's group themselves, so a spool made by an older unit still works."""
    try:
        os.chmod(directory, mode)
    except PermissionError:
        logfmt.warn(
            "spool directory is not setgid; writers set their files' group themselves",
            directory=directory,
            fix=f"install -d -m {mode:04o} -g {group} {directory}",
        )


def _check_member(group: str) -> None:
    """The daemon (unless root) must be in each role group: it opens the files dropped in the
    role's directory through that group."""
    gid = _gid(group)
    if os.geteuid() == 0 or gid == os.getegid() or gid in os.getgroups():
        return
    me = user_name(os.geteuid())
    raise SpoolPermissionError(
        f"the daemon's user {me} is not in group {group} (from [spool] in the config), so it "
        f"could not open the files dropped in the spool by that group's members. Fix: "
        f"usermod -aG {group} {me} (the shipped unit also names it in SupplementaryGroups=)"
    )


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid:{gid}"


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return [e for e in it if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1


def approval_refusal(
    path: Path, st: os.stat_result, *, approvers_group: str, daemon_uid: int, allow_root: bool
) -> str | None:
    """Why a decision file's owner does not count as an approver (S36), or None if it does.

    The owner is who the kernel says wrote the file. A file with a second hard link, writable
    by others, or carrying an ACL could have been written by someone else, so it never counts.
    With ``approvers_group`` set (every real deployment), the owner must be in that group, must
    not be the daemon's own user, and must not be root unless ``allow_root``; without it (a
    one-person setup, the demo, the tests) the owner alone is recorded.
    """
    if st.st_nlink > 1:
        return (
            f"the file has {st.st_nlink} hard links: its owner may not be who wrote it "
            f"(write decisions with bide decide)"
        )
    acl = _acl_grants(path)
    if acl:
        return f"the file carries a POSIX ACL ({acl}): others may have written it"
    if stat.S_IMODE(st.st_mode) & 0o022:
        return "the file is writable by group or others: anyone could have written it"
    if not approvers_group:
        return None
    name = user_name(st.st_uid)
    if st.st_uid == daemon_uid:
        return f"the file is owned by the daemon's own user ({name}), who is no approver"
    if st.st_uid == 0 and not allow_root:
        return (
            "the file is owned by root, who is no approver unless [spool] "
            "allow_root_approval = true"
        )
    gid = _gid(approvers_group)
    try:
        entry = pwd.getpwuid(st.st_uid)
        groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    except KeyError:
        groups = []
    if gid not in groups:
        return (
            f"the file's owner {name} is not in the approvers' group {approvers_group} "
            f"(fix: usermod -aG {approvers_group} {name}, if they should approve)"
        )
    return None


def _acl_grants(path: Path) -> str:
    """The POSIX ACL extended attributes ``path`` carries ('' when none, or not supported)."""
    found = []
    for name in ("system.posix_acl_access", "system.posix_acl_default"):
        try:
            os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
        found.append(name.rsplit("_", 1)[-1])
    return " and ".join(found)


def user_name(uid: int) -> str:
    """The user name of ``uid``, or ``uid:N`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"


def _gid(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise SpoolPermissionError(
            f"group {group!r} (from [spool] in the config) does not exist; create it with "
            f"groupadd {group}, or clear the setting"
        ) from None


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except FileNotFoundError:
        return 0.0


def request_id_of(path: Path) -> str | None:
    """The request id a spool file name carries, if it is a well-formed one."""
    stem = path.name.removesuffix(".json")
    return stem if len(stem) == 32 and all(c in "0123456789abcdef" for c in stem) else None
