"""The OpenAPI document is generated from the structs, checked in, and served as checked in."""

from __future__ import annotations

import json
from pathlib import Path

import daemon.api
from daemon.api.openapi import ROUTES, build, openapi_document

CHECKED_IN = Path(daemon.api.__file__).parent / "openapi.json"


def test_the_checked_in_document_is_the_generated_one() -> None:
    assert CHECKED_IN.read_bytes() == openapi_document(), (
        "daemon/api/openapi.json is stale: python -m daemon.api.openapi > daemon/api/openapi.json"
    )


def test_every_route_and_every_schema_it_names_is_in_the_document() -> None:
    doc = build()
    assert doc["openapi"].startswith("3.1")
    for route in ROUTES:
        operation = doc["paths"][route.path][route.method]
        for status in route.answers:
            ref = operation["responses"][str(status)]["content"]["application/json"]["schema"]
            assert ref["$ref"].rsplit("/", 1)[1] in doc["components"]["schemas"]
    refs = {m for m in json.dumps(doc).split('"$ref": "#/components/schemas/')[1:]}
    assert {r.split('"', 1)[0] for r in refs} <= set(doc["components"]["schemas"])
