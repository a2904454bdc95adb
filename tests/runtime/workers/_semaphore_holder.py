"""One process of the global semaphore test: take a permit of ``api`` (limit 2) from the
control plane, mark itself a holder in a shared directory, count the holders, release.

usage: python _semaphore_holder.py DSN DIR ROUNDS
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from lodger.storage.control import open_control


async def main(dsn: str, shared: Path, rounds: int) -> None:
    control = open_control(dsn)
    await control.start()
    holders = shared / "holders"
    most, refused = 0, 0
    try:
        for _ in range(rounds):
            while (
                permit := await control.acquire_permit(
                    name="api", limit=2, holder=str(os.getpid()), ttl_s=30
                )
            ) is None:
                refused += 1
                await asyncio.sleep(0.01)
            mark = holders / str(os.getpid())
            mark.touch()
            most = max(most, len(list(holders.iterdir())))
            await asyncio.sleep(0.1)  # hold it while the others try
            most = max(most, len(list(holders.iterdir())))
            mark.unlink()
            await control.release_permit(name="api", permit=permit)
    finally:
        await control.close()
    (shared / f"result-{os.getpid()}").write_text(
        json.dumps({"most": most, "refused": refused, "rounds": rounds})
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
