"""AWS's JSON protocol, simulated: ``POST /`` with ``X-Amz-Target`` and the job named in the
body (Step Functions ``DescribeExecution``: ``{"executionArn": ...}``), and, when the script
gives a key pair, every such request's Signature V4 verified the way AWS does: recomputed by
botocore's own signer over the request as received (method, path, query, the headers it
says it signed, the body) and compared in constant time. Needs ``bide[aws]`` only when
verifying.

Script keys (``[server.aws_json]``)::

    job_field = "executionArn"      # the body's key naming the job
    access_key_id = "AKIDEXAMPLE"   # with secret_access_key: verify SigV4, else Bearer as usual
    secret_access_key = "..."
    region = "us-east-1"
    service = "states"
"""

from __future__ import annotations

import hmac
import re
from datetime import UTC, datetime

import msgspec

__all__ = ["AwsJson", "signature_problem"]

#: AWS refuses a request whose X-Amz-Date is further than this from its clock.
MAX_SKEW_SECONDS = 300
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, ?SignedHeaders=(?P<signed>[a-z0-9;-]+), ?"
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)


class AwsJson(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``[server.aws_json]``: serve status reads as AWS's JSON protocol does."""

    job_field: str = "executionArn"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    region: str = "us-east-1"
    service: str = "states"


def signature_problem(
    config: AwsJson,
    *,
    method: str,
    url: str,
    headers: tuple[tuple[str, str], ...],
    body: bytes,
    wall: float,
) -> str | None:
    """Why this request's SigV4 signature does not hold (``None`` when it does)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    given = {name.lower(): value for name, value in headers}
    m = _AUTH.match(given.get("authorization", ""))
    if m is None:
        return "missing or malformed AWS4-HMAC-SHA256 Authorization header"
    if m["key"] != config.access_key_id:
        return "unknown access key id"
    if (m["region"], m["service"]) != (config.region, config.service):
        scope = f"{config.region}/{config.service}"
        return f"credential scope is {m['region']}/{m['service']}, not {scope}"
    stamp = given.get("x-amz-date", "")
    try:
        when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return "missing or malformed X-Amz-Date"
    if abs(when - wall) > MAX_SKEW_SECONDS or stamp[:8] != m["date"]:
        return "X-Amz-Date is not now (signature expired or from the future)"
    signed = m["signed"].split(";")
    if "host" not in signed or any(name not in given for name in signed):
        return "a signed header is missing from the request (or host is not signed)"
    request = AWSRequest(
        method=method, url=url, headers={name: given[name] for name in signed}, data=body
    )
    request.context["timestamp"] = stamp
    auth = SigV4Auth(
        Credentials(config.access_key_id, config.secret_access_key), config.service, config.region
    )
    expected = auth.signature(
        auth.string_to_sign(request, auth.canonical_request(request)), request
    )
    if not hmac.compare_digest(expected, m["signature"]):
        return "the signature does not match the request"
    return None
