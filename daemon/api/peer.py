"""Who is on the other end of a Unix socket: the kernel says, the client never does.

``SO_PEERCRED`` gives the uid, gid and pid of the process that connected; the uid's user name
and its groups (``getgrouplist``) give the roles the config assigns (the rules are
:class:`daemon.engine.intake.Authority`'s):

* ``agent``: may register, submit, read, wait on and withdraw its *own* operations;
* ``approver``: may answer escalations (never of its own operations, unless the config
  allows self-approval);
* ``operator``: may read everything; root and the daemon's own user always are.

A role whose group is not configured (empty) admits every user who can reach the socket: one
person on one machine needs no groups. Roles are looked up per connection, so a user added to a
group gains its role on their next connection, with no restart.
"""

from __future__ import annotations

import pwd
import socket
import struct
from dataclasses import dataclass

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    """The peer's credentials, as the kernel recorded them when it connected."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def user_name(uid: int) -> str:
    """The user name of ``uid``, or ``uid:N`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"
