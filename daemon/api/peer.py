"""Who is on the other end of a Unix socket: the kernel says, the client never does.

``SO_PEERCRED`` gives the uid, gid and pid of the process that connected; the uid's user name
and its groups (``getgrouplist``) give the roles the config assigns:

* ``agent``: may register, submit, read, wait on and withdraw its *own* operations;
* ``approver``: may answer escalations (never of its own operations, unless the config
  allows self-approval);
* ``operator``: may read everything; root and the daemon's own user always are.

A role whose group is not configured (empty) admits every user who can reach the socket: one
person on one machine needs no groups. Roles are looked up per connection, so a user added to a
group gains its role on their next connection, with no restart.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass
from typing import Literal

Role = Literal["agent", "approver", "operator"]
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


@dataclass(frozen=True)
class RoleGroups:
    """The groups that give each role ("" = everyone who can reach the socket; None for the
    approvers: nobody, when the agents are a group and the approvers are not)."""

    agents: str
    approvers: str | None
    operators: str

    def describe(self, role: Role) -> str:
        if role == "approver" and self.approvers is None:
            return "nobody until [api] approvers_group is set"
        group = {"agent": self.agents, "approver": self.approvers,
                 "operator": self.operators}[role]
        return f"group {group!r}" if group else "anyone"


def user_name(uid: int) -> str:
    """The user name of ``uid``, or ``uid:N`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"


def groups_of(uid: int, gid: int) -> set[str]:
    """Names of the groups ``uid`` is in (its primary group and supplementary ones)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        gids = [gid]
    else:
        gids = os.getgrouplist(entry.pw_name, entry.pw_gid)
    names = set()
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            continue
    return names


def roles_of(peer: Peer, groups: RoleGroups, *, daemon_uid: int) -> list[Role]:
    member = groups_of(peer.uid, peer.gid)
    roles: list[Role] = []
    if not groups.agents or groups.agents in member:
        roles.append("agent")
    if groups.approvers is not None and (not groups.approvers or groups.approvers in member):
        roles.append("approver")
    if peer.uid in (0, daemon_uid) or (groups.operators and groups.operators in member):
        roles.append("operator")
    return roles
