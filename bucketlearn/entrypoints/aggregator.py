"""The long-running aggregator's process (``bucketlearn aggregator``: the aggregator pool's
container command, a process of the local stack): serve results until SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("bucketlearn.aggregator")


def main() -> None:
    from bucketlearn.aggregation.process import AggregatorService  # noqa: PLC0415
    from bucketlearn.bootstrap import process_services  # noqa: PLC0415
    from bucketlearn.logs import setup_logging  # noqa: PLC0415

    svc = process_services()
    setup_logging(svc.settings.log_format)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    service = AggregatorService(svc, stop)
    log.info("aggregator %s serving %s", service.identity, svc.settings.results_subscription)
    service.run()


if __name__ == "__main__":
    main()
