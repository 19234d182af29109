"""A process that takes one slot of a GPU lock through its own embedded Prefect server.

``python -m tests.helpers.lockholder ROLE LOCK CAMPAIGN OUT``: prints ``server PID`` once its
server is up, ``held WAITED_S`` once it holds the slot; a ``holder`` then keeps the slot until
it is killed, a ``waiter`` lets it go and exits. The waiter's log goes to stdout.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from gpucampaign.cli.runner import load_embedded, prefect_environment


def main(role: str, lock: str, campaign: str, out: str) -> None:
    for key, value in prefect_environment(logging_level="WARNING").items():
        os.environ.setdefault(key, value)
    server = load_embedded("start_detached")()
    from gpucampaign_prefect.orchestration.gpu_lock import ensure_gpu_limit, gpu_slot

    log = logging.getLogger("gpucampaign.gpu_lock")
    log.addHandler(logging.StreamHandler(sys.stdout))
    log.setLevel(logging.INFO)
    ensure_gpu_limit(lock, 1, clear_stale=False)
    print(f"server {server.server_process.pid}", flush=True)
    with gpu_slot(lock, timeout_s=240, lease_s=600, campaign=campaign, out=out, recheck_s=1):
        print(f"held {time.monotonic()}", flush=True)
        if role == "holder":
            time.sleep(600)


if __name__ == "__main__":
    main(*sys.argv[1:5])
