"""A worker of the agent `slow` for the tests that kill or stop one: the
first delivery of a step sleeps ``input.sleep_s``, later ones do not.
``LEASE_MS`` is the lease it holds. One step at a time, so that while it
works it has no long poll open that a SIGKILL would leave behind on the
server (taking the next request for one lease)."""

import logging
import os
import time

from rota import Json, Step, Worker

logging.basicConfig(level=logging.INFO, format="%(message)s")
worker = Worker(lease_ms=int(os.environ["LEASE_MS"]), concurrency=1)


@worker.step("slow")
def work(step: Step) -> Json:
    if step.delivery_count == 1:
        time.sleep(step.input["sleep_s"])
    return {"pid": os.getpid(), "delivery_count": step.delivery_count, "attempt": step.attempt}


worker.run()
