"""Status reads sent as POST (AWS's JSON protocol: Step Functions ``DescribeExecution``, Batch
``DescribeJobs``), allowed only on the operator's explicit word (S19).

A profile may say ``method = "POST"`` for its status call only together with
``read_only_post = true`` (the operator asserts the call reads and changes nothing) and a fixed
``body`` template holding ``{job_id}`` exactly once, inside a JSON string. The job id is
JSON-string-escaped into it (:func:`status_body`): nothing an agent gives can add a key, end
the string or change the call. The URL then names no job: it is the API's endpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from daemon.errors import ConfigError

PLACEHOLDER = "{job_id}"
_PROBE = 'probe"\\\x01'  # a job id that would break out of a string if it were not escaped


def escape_job_id(job_id: str) -> str:
    """The job id as the inside of a JSON string: quotes, backslashes and control characters
    escaped, so it can neither end the string nor add a key."""
    return json.dumps(job_id, ensure_ascii=True)[1:-1]


def status_body(template: str, job_id: str) -> bytes:
    """The POST body for ``job_id``: the template with the id JSON-escaped into its string."""
    return template.replace(PLACEHOLDER, escape_job_id(job_id)).encode("utf-8")


def check_status_table(path: Path, status: object, line_of: dict[str, int]) -> None:
    """Refuse a ``[status]`` table whose POST is not declared a fixed read, before anything
    else reads it; ``line_of`` gives the line of each key for the message."""
    if not isinstance(status, dict):
        return
    method = status.get("method", "GET")
    body, declared = status.get("body"), status.get("read_only_post")

    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}:{line_of.get(key, 0)}: status.{key}: {why}")

    if method != "POST":
        for key in ("body", "read_only_post"):
            if key in status:
                raise fail(key, 'only for a status read sent as method = "POST"; remove it')
        return
    if declared is not True or not isinstance(body, str):
        missing = [
            k
            for k, ok in (
                ("read_only_post = true", declared is True),
                ("body", isinstance(body, str)),
            )
            if not ok
        ]
        raise fail(
            "method",
            f'"POST" is not a safe method (S19); a status read may be sent as POST only when '
            f"the profile also sets {' and '.join(missing)} (a fixed JSON body template holding "
            f'{PLACEHOLDER} once, e.g. body = \'{{"executionArn": "{PLACEHOLDER}"}}\'), '
            f"declaring that the call reads and changes nothing; otherwise use GET or HEAD",
        )
    if body.count(PLACEHOLDER) != 1 or "{+job_id}" in body:
        raise fail("body", f"the body template must hold {PLACEHOLDER} exactly once")
    try:
        probe = json.loads(status_body(body, _PROBE))
    except ValueError:
        raise fail(
            "body", f"the body template is not JSON once {PLACEHOLDER} is filled in"
        ) from None
    if _PROBE not in _strings(probe):
        raise fail(
            "body",
            f"{PLACEHOLDER} must be a whole JSON string value, as in "
            f'{{"executionArn": "{PLACEHOLDER}"}}',
        )
    url = status.get("url")
    if isinstance(url, str) and "job_id}" in url:
        raise fail("url", f"with a POST read the job id goes in the body; remove {PLACEHOLDER}")


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []
