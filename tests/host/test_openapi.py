"""The committed OpenAPI document is the one the app generates (the contract drifts
only on purpose: regenerate it with ``python -m lodger.host.openapi > docs/openapi.json``)."""

from __future__ import annotations

import json
from pathlib import Path

from lodger.host.openapi import document, document_text

COMMITTED = Path(__file__).parents[2] / "docs" / "openapi.json"


def test_the_committed_openapi_document_matches_the_app() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == document_text(), (
        "the API changed: run `python -m lodger.host.openapi > docs/openapi.json` and review "
        "the diff of the contract"
    )


def test_every_route_declares_its_errors_and_the_bearer_scheme() -> None:
    doc = document()
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            assert "422" in op["responses"] and "401" in op["responses"], (method, path)
            # pages: no data; webhooks carry signatures, an OAuth callback its one-use state
            if not path.startswith(("/hooks/", "/timeline/", "/console", "/oauth/")):
                assert op.get("security") == [{"HTTPBearer": []}], (method, path)
    body = doc["components"]["schemas"]["ErrorBody"]
    assert json.dumps(body).count("ErrorDetail") == 1
