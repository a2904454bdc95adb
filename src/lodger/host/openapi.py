"""The OpenAPI document of the host, the API's contract (``docs/openapi.json``).

``python -m lodger.host.openapi > docs/openapi.json`` writes it again after a change of
the API; ``tests/host/test_openapi.py`` fails when the committed file drifts from it.
"""

from __future__ import annotations

import json
from typing import Any

from lodger.host.app import create_app
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.storage.control.host_index import SqliteHostControl

__all__ = ["document", "document_text"]


def document() -> dict[str, Any]:
    control = SqliteHostControl(":memory:")
    try:
        app = create_app(Sessions(Storage.memory()), control)
        return app.openapi()
    finally:
        control._db.close()


def document_text() -> str:
    return json.dumps(document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(document_text(), end="")
