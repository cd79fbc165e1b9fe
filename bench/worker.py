"""One measurement in a fresh process: `python -m bench.worker SYSTEM ACTION JSON-KWARGS`.

The driver starts one of these per measurement, alternating systems, and reads the result line.
"""

from __future__ import annotations

import importlib
import json
import sys

from bench.common import emit

SYSTEMS = {
    "contextos": "bench.sys_contextos",
    "langgraph": "bench.sys_langgraph",
    "raw": "bench.sys_raw",
    "dbos": "bench.sys_dbos",
    # Workloads that measure several systems in one module.
    "governed": "bench.governed",
    "scaleout": "bench.scaleout",
    "longrun": "bench.longrun",
}


def main() -> None:
    system, action, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    module = importlib.import_module(SYSTEMS[system])
    emit(getattr(module, action)(**json.loads(raw)))


if __name__ == "__main__":
    main()
