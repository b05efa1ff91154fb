"""Node keys: forward-secure signing when any of several nodes may take a log over.

A log's epoch keys (:mod:`eventlog.epochs`) live on the host that holds the log; a node that
takes the log over (PostgreSQL, ``daemon.node``) cannot continue a chain whose current key is on
another host, perhaps a dead one. So each node has a key chain of its own:

    enrolment   ``bide node enroll --name NODE`` (the one step that needs the root private key)
                makes the node's key 1 and a certificate (:class:`~eventlog.envelope.NodeCert`)
                over (node name, key 1, not-before), signed by the root key. The certificate is
                for *any log of this root*, not for one log id: a sharded node holds many logs
                (one per shard), shards are created after nodes are enrolled, and a log made
                afresh (``bide log init``) must not need the root key back online. The root
                already decides which logs exist; the certificate only says which nodes may
                continue them.
    use         a node signs with its current node key two kinds of record only: the genesis
                of a log it creates, and the first checkpoint of its term on a log it opens
                (the takeover). Both carry the certificate and the links from key 1 to the signing
                key, and certify the log's next *epoch* key, made on this node; the log's chain
                then goes on exactly as on one host (epoch keys evolve and are destroyed).
    evolution   each node key signs one such record: right after, the node makes key ``k+1``,
                signs the link ``k -> k+1`` (:class:`~eventlog.envelope.NodeLink`) with key
                ``k`` and destroys key ``k``.

``bide verify`` with ``verify.pub`` alone checks a node-signed record: the certificate under
the root key, every link under the key before it, the record under the last key; and that a
node never signs with a key index at or below one the log already saw it use (a destroyed key
used again; a node enrolled again starts a new chain, told apart by its certificate's key).
See eventlog/AUDIT.md for what a thief of a node's current key can do.

Bound: a record carries one link per record the node signed with a node key since enrolment
(about 200 bytes each); :data:`MAX_LINKS` caps it, after which the node refuses to take a log
over until it is enrolled again (``bide node enroll`` resets the chain to key 1).

Files, in ``<state_dir>/node/`` (0700), copied there from ``bide node enroll --out``:
    node.cert                 the certificate (JSON; not secret)
    links.jsonl               the links made since enrolment, one JSON line each (not secret)
    node-key-<k>.key          the current node key {"node", "index", "seed"}, 0600; one file
                              in the steady state (the running node reconciles after a crash)
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from eventlog.envelope import NodeCert, NodeLink, node_cert_message, node_link_message
from eventlog.errors import KeyFileError
from eventlog.fsync import fsync_dir
from eventlog.keys import KEY_BYTES, Signer, VerifyKey, fingerprint, read_seed_file

NODE_DIR = "node"
CERT_FILE = "node.cert"
LINKS_FILE = "links.jsonl"
MAX_LINKS = 4096
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_KEY_RE = re.compile(r"^node-key-(\d{8,})\.key$")


class _NodeKeyFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    node: str
    index: int
    seed: str


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _raw_key(text: str) -> bytes | None:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != KEY_BYTES or _b64(raw) != text:
        return None
    return raw


def _sig_ok(key: bytes, sig: str, message: bytes) -> bool:
    try:
        raw = base64.b64decode(sig, validate=True)
        if _b64(raw) != sig:
            return False
        Ed25519PublicKey.from_public_bytes(key).verify(raw, message)
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def node_key_name(index: int) -> str:
    return f"node-key-{index:08d}.key"


# -- checking (the verifier's part: public keys only) ---------------------------------------


@dataclass(frozen=True)
class ChainEnd:
    """Where a node's chain, as a record presents it, ends: the key that signs."""

    node: str
    index: int
    key: bytes
    t_us: int  # when that key was certified (the certificate's not-before for key 1)
    enrolled: str  # the certificate's key (base64): one enrolment of the node


#: Links already verified in this process, by (certifying key, signature): every record a node
#: signs repeats its chain, and a log verified from its start would check each link again.
_verified_links: dict[tuple[bytes, str], tuple[int, str, int]] = {}
_VERIFIED_LINKS_MAX = 200_000


def check_chain(
    root_key: bytes, cert: NodeCert | None, links: tuple[NodeLink, ...]
) -> ChainEnd | str:
    """The end of the chain ``cert`` -> ``links``, or why it does not hold (naming the
    node and the step)."""
    if cert is None:
        return "it carries no node certificate: the key that signed it was never enrolled"
    if cert.root != fingerprint(root_key):
        return (
            f"node {cert.node!r}'s certificate is from another root key (fingerprint "
            f"{cert.root[:16]}...): the node was not enrolled with this log's root"
        )
    key = _raw_key(cert.key)
    if (
        key is None
        or not NODE_NAME_RE.match(cert.node)
        or not _sig_ok(
            root_key, cert.sig, node_cert_message(cert.node, cert.root, key, cert.not_before_us)
        )
    ):
        return (
            f"node {cert.node!r}'s certificate does not verify under the root key: it was "
            f"forged or altered (the node was not enrolled with bide node enroll)"
        )
    index, t_us = 1, cert.not_before_us
    if len(links) > MAX_LINKS:
        return f"node {cert.node!r}'s key chain is longer than {MAX_LINKS} links"
    for link in links:
        known = _verified_links.get((key, link.sig))
        if (
            known is not None
            and known == (link.index, link.key, link.t_us)
            and link.index == index + 1
        ):
            index, key, t_us = link.index, _raw_key(link.key) or b"", link.t_us
            continue
        nxt = _raw_key(link.key)
        if link.index != index + 1:
            return (
                f"node {cert.node!r}'s key chain is truncated or reordered: key {index} is "
                f"followed by a link to key {link.index}"
            )
        if (
            nxt is None
            or link.t_us < t_us
            or not _sig_ok(key, link.sig, node_link_message(cert.node, link.index, nxt, link.t_us))
        ):
            return (
                f"node {cert.node!r}'s key {link.index} is not certified by its key {index}: "
                f"the link was forged or altered"
            )
        if len(_verified_links) >= _VERIFIED_LINKS_MAX:
            _verified_links.clear()
        _verified_links[(key, link.sig)] = (link.index, link.key, link.t_us)
        index, key, t_us = link.index, nxt, link.t_us
    return ChainEnd(cert.node, index, key, t_us, cert.key)


# -- enrolment (where the root key is) --------------------------------------------------------


def enroll(root: Signer, node: str, out_dir: Path, now_us: int | None = None) -> tuple[Path, Path]:
    """Make node ``node``'s key 1 and its certificate in ``out_dir`` (created 0700); refuses
    to overwrite either. Returns (certificate, private key) paths."""
    if not NODE_NAME_RE.match(node):
        raise KeyFileError(
            f"node name {node!r}: use 1-64 of A-Z a-z 0-9 . _ - (the name [postgres] node "
            f"gives the daemon, which it writes into every takeover record)"
        )
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = out_dir / CERT_FILE, out_dir / node_key_name(1)
    for path in (cert_path, key_path, out_dir / LINKS_FILE):
        if path.exists():
            raise KeyFileError(
                f"{path} exists: refusing to overwrite a node's keys (move the directory "
                f"aside, or choose another --out)"
            )
    private = Ed25519PrivateKey.generate()
    signer = Signer(private)
    not_before = now_us if now_us is not None else time.time_ns() // 1000
    message = node_cert_message(node, root.fingerprint, signer.public_bytes, not_before)
    cert = NodeCert(node, root.fingerprint, _b64(signer.public_bytes), not_before, "")
    cert = msgspec.structs.replace(cert, sig=_b64(root.sign(message)))
    _write_key(out_dir, node, 1, private)
    _write_durably(cert_path, msgspec.json.encode(cert) + b"\n", 0o644)
    return cert_path, key_path


def _write_durably(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, mode)
    fsync_dir(path.parent)


def _write_key(directory: Path, node: str, index: int, private: Ed25519PrivateKey) -> Path:
    from eventlog.epochs import destroy_key_file

    path = directory / node_key_name(index)
    if path.exists():
        destroy_key_file(path)  # a key made before a crash and never certified
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    _write_durably(path, msgspec.json.encode(_NodeKeyFile(node, index, _b64(seed))) + b"\n", 0o600)
    return path


def _read_key(path: Path) -> tuple[str, int, Signer]:
    kf, signer = read_seed_file(path, "node key", _NodeKeyFile)
    return kf.node, kf.index, signer


# -- the node's own chain (where the node runs) -----------------------------------------------


def not_enrolled(directory: Path, verify_key: VerifyKey, node: str) -> str | None:
    """Why ``directory`` does not hold node ``node``'s enrolment under ``verify_key``; None
    when it does (the certificate verifies and the current key is there)."""
    try:
        NodeChain(directory, verify_key, node)
    except KeyFileError as exc:
        return str(exc)
    return None


class NodeChain:
    """This node's key chain (see the module docstring), shared by every log the process
    writes: :meth:`sign` is thread-safe (shard writers sign from worker threads)."""

    def __init__(self, directory: Path, verify_key: VerifyKey, node: str) -> None:
        """Load and check the chain (read only: see :meth:`reconcile`)."""
        self.directory = directory
        fix = (
            f"enrol it where signing.key is: bide node enroll --name {node} --out DIR, then "
            f"copy DIR's files into {directory}/ (mode 0700)"
        )
        try:
            cert = msgspec.json.decode((directory / CERT_FILE).read_bytes(), type=NodeCert)
        except OSError:
            raise KeyFileError(
                f"node {node!r} is not enrolled: {directory / CERT_FILE} is missing; {fix}"
            ) from None
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise KeyFileError(
                f"{directory / CERT_FILE} is not a bide node certificate; {fix}"
            ) from None
        if cert.node != node:
            raise KeyFileError(
                f"{directory / CERT_FILE} enrols node {cert.node!r}, but this node is named "
                f"{node!r} ([postgres] node); {fix}"
            )
        self.links = self._read_links()
        end = check_chain(verify_key.raw, cert, tuple(self.links))
        if isinstance(end, str):
            raise KeyFileError(f"{directory}: {end}; {fix}")
        self.cert, self.node, self.index = cert, node, end.index
        self._t_us = end.t_us
        found: Signer | None = None
        current = directory / node_key_name(end.index)
        if current.exists():
            name, index, signer = _read_key(current)
            if (name, index) == (node, end.index) and signer.public_bytes == end.key:
                found = signer
        if found is None:
            raise KeyFileError(
                f"node {node!r} is at key {end.index}, but {directory / node_key_name(end.index)} "
                f"is missing or holds another key (node keys are destroyed after use and cannot "
                f"be restored); {fix}"
            )
        self._signer = found
        self._lock = threading.Lock()
        #: Node keys used (for tests and the log): how many records this process signed.
        self.signed = 0

    def reconcile(self) -> int:
        """Destroy every node key file but the current one: an earlier key a crash left before
        it was destroyed, or a next key made and never certified. Only the node that signs
        calls it (``bide run``, holding the state directory's lock): a reader running beside
        it could see the next key before its link is written. Returns how many went."""
        from eventlog.epochs import destroy_key_file

        with self._lock:
            n = 0
            for path in sorted(self.directory.iterdir()):
                m = _KEY_RE.match(path.name)
                if m and int(m.group(1)) != self.index:
                    destroy_key_file(path)
                    n += 1
            return n

    def _read_links(self) -> list[NodeLink]:
        path = self.directory / LINKS_FILE
        if not path.exists():
            return []
        links: list[NodeLink] = []
        lines = path.read_bytes().split(b"\n")
        for n, line in enumerate(lines):
            if not line:
                continue
            try:
                links.append(msgspec.json.decode(line, type=NodeLink))
            except (msgspec.DecodeError, msgspec.ValidationError):
                if n >= len(lines) - 2:  # a torn last line: the link was never complete
                    break
                raise KeyFileError(f"{path} line {n + 1} is not a node key link") from None
        return links

    def sign(self, message: bytes) -> tuple[bytes, NodeCert, tuple[NodeLink, ...]]:
        """Sign ``message`` with the current node key, then evolve: the next key is made and
        certified, and this one destroyed. Returns the signature and the chain to carry."""
        with self._lock:
            if len(self.links) >= MAX_LINKS:
                raise KeyFileError(
                    f"node {self.node!r} has signed {MAX_LINKS} takeovers since it was "
                    f"enrolled; enrol it again (bide node enroll) to start a short chain"
                )
            sig = self._signer.sign(message)
            chain = (self.cert, tuple(self.links))
            self._evolve()
            self.signed += 1
            return sig, chain[0], chain[1]

    def _evolve(self) -> None:
        from eventlog.epochs import destroy_key_file

        index = self.index + 1
        private = Ed25519PrivateKey.generate()
        new = Signer(private)
        t_us = max(time.time_ns() // 1000, self._t_us)
        link = NodeLink(index, _b64(new.public_bytes), t_us, "")
        message = node_link_message(self.node, index, new.public_bytes, t_us)
        link = msgspec.structs.replace(link, sig=_b64(self._signer.sign(message)))
        _write_key(self.directory, self.node, index, private)
        path = self.directory / LINKS_FILE
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, msgspec.json.encode(link) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.directory)
        destroy_key_file(self.directory / node_key_name(self.index))
        self.links.append(link)
        self.index, self._signer, self._t_us = index, new, t_us
