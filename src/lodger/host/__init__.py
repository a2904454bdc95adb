"""The HTTP host: sessions over an API, live event streams, approvals from anywhere.

>>> app = create_app(Sessions(Storage.local(".lodger")), SqliteHostControl(".lodger/host.sqlite3"))

``lodger serve`` runs it with uvicorn (``lodger.host.server``); ``lodger.client`` speaks
to it. See ``lodger.host.routes`` for the routes and ``docs/openapi.json`` for the contract.
"""

from lodger._core.extras import require
from lodger.storage.control.host_index import HostControl, SqliteHostControl

# every module of the package is imported after this one: the guard covers them all
with require("host", "the HTTP host (lodger serve, lodger.host)"):
    from lodger.host.app import create_app
    from lodger.host.hub import HostConfig, Hub
    from lodger.host.webhooks import HookConfig

__all__ = ["HookConfig", "HostConfig", "HostControl", "Hub", "SqliteHostControl", "create_app"]
