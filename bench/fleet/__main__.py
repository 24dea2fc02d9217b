"""`python -m bench.fleet flood SERVERS STREAM PREFIX NODES CONNECTIONS MAX_IN_FLIGHT FIRST STOCK`:
a generator process of a capacity row (started by `in_processes`, from the repository)."""

from __future__ import annotations

import asyncio
import json
import sys

from bench.fleet.capacity import flood_command

if sys.argv[1:2] != ["flood"] or len(sys.argv) != 10:
    raise SystemExit(__doc__)
servers_, stream_, prefix_, *numbers = sys.argv[2:]
asyncio.run(flood_command(json.loads(servers_), stream_, prefix_, *map(int, numbers)))
