#!/usr/bin/env python3
"""A rota worker in Python: a toy payment service as a remote agent.

It runs on the Python client (``clients/python``, standard library only):
``Worker`` long-polls the agent's queue, renews each lease while the
handler runs, retries ``Retryable`` faults with the request's retry policy
inside its deadline, fails ``Permanent`` ones at once, stays silent past the
deadline, and on SIGTERM finishes the steps in hand before it exits.

    python3 worker.py --url http://127.0.0.1:7878 --agent py-payments [--token TOKEN]

The token (also ``ROTA_TOKEN``) needs the scope ``agent:agent.py-payments``
(or ``admin``). Replace ``handle`` with your own code.
"""

import argparse
import logging
import os
import sys
import time
from pathlib import Path

try:
    from rota import Json, Permanent, Retryable, Step, Worker
except ImportError:
    # Run from a checkout without `pip install ./clients/python`: use its source.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "clients" / "python" / "src"))
    from rota import Json, Permanent, Retryable, Step, Worker


def handle(step: Step) -> Json:
    """The example agent: a payment service.

    Declines ``card: declined`` for good, fails the first attempt of
    ``flaky: true`` transiently, sleeps ``slow_ms`` (its lease renewed
    meanwhile), and refunds on compensation. ``step.idempotency_key`` is
    what a real service would be given, to apply each charge once.
    """
    data = step.input if isinstance(step.input, dict) else {}
    key = step.idempotency_key
    if step.compensate:
        return {"refunded": data.get("amount"), "key": key}
    if data.get("card") == "declined":
        raise Permanent("card declined")
    if data.get("flaky") and step.attempt == 1:
        raise Retryable("payment gateway timed out")
    slow_ms = data.get("slow_ms") or 0
    if slow_ms:
        time.sleep(min(slow_ms / 1000.0, step.remaining()))
    return {
        "step": step.name,
        "amount": data.get("amount"),
        "key": key,
        "attempt": step.attempt,
        "delivery_count": step.delivery_count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("ROTA_URL", "http://127.0.0.1:7878"))
    parser.add_argument("--agent", default=os.environ.get("ROTA_AGENT", "py-payments"))
    parser.add_argument("--token", default=os.environ.get("ROTA_TOKEN"))
    parser.add_argument("--concurrency", type=int, default=4, help="requests worked on at once")
    parser.add_argument("--wait-ms", type=int, default=5000, help="long-poll wait of a receive")
    parser.add_argument("--name", default=None, help="recorded as the lease owner (default: host-pid)")
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, format="worker: %(message)s")
    worker = Worker(args.url, args.token, concurrency=args.concurrency, wait_ms=args.wait_ms, name=args.name)
    worker.step(args.agent)(handle)
    worker.run()


if __name__ == "__main__":
    main()
