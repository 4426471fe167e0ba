"""The commands that run the deployment's processes: ``worker`` and ``aggregator`` (the
containers' commands, over ``entrypoints.worker`` and ``entrypoints.aggregator``), ``autoscale``
(one step of the cloud controller) and ``watchdog`` (one pass of it; also ``tend``, its former name)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from bucketlearn.config import load_settings
from bucketlearn.entrypoints.cli import common
from bucketlearn.entrypoints.cli.common import EXIT_OK, emit


def watchdog_once(svc: Any) -> dict[str, Any]:
    """One watchdog pass: dead letters into failure markers, then stalled jobs moved on."""
    from bucketlearn.adapters.pubsub import PubSubQueue  # noqa: PLC0415
    from bucketlearn.loops.watchdog import drain_dead_letters, watchdog_pass  # noqa: PLC0415

    markers = 0
    if svc.settings.dead_letter_subscription:
        markers = drain_dead_letters(svc, PubSubQueue(svc.settings,
                                                      svc.settings.dead_letter_subscription))
    return {"dead_letters": markers, "watched": watchdog_pass(svc)}


def cmd_watchdog(args: argparse.Namespace) -> int:
    """One pass of the watchdog over every active job (the autoscaler runs it too)."""
    emit(watchdog_once(common.services(args)))
    return EXIT_OK


def cmd_autoscale(args: argparse.Namespace) -> int:
    """One step of the cloud controller (run every minute by Cloud Scheduler): the worker pool
    sized from the backlog, then the watchdog's pass."""
    from bucketlearn.adapters.cloudrun import CloudRunWorkerPool  # noqa: PLC0415
    from bucketlearn.config import load_autoscaler_settings  # noqa: PLC0415
    from bucketlearn.logs import setup_logging  # noqa: PLC0415
    from bucketlearn.loops.autoscale import (  # noqa: PLC0415
        JOBS_PER_AGGREGATOR,
        ScalingPolicy,
        autoscale_once,
    )

    settings = load_settings()
    setup_logging(settings.log_format)
    scaler = load_autoscaler_settings()
    svc = args.services(settings)
    state = svc.registry.get_control("autoscaler") or {}
    cooldown = scaler.scale_down_cooldown_seconds
    aggregators = (CloudRunWorkerPool(scaler.aggregator_pool) if scaler.aggregator_pool
                   else None)
    decision = autoscale_once(svc.registry, CloudRunWorkerPool(scaler.worker_pool),
                              ScalingPolicy(scaler.min_workers, scaler.max_workers,
                                            scale_down_cooldown_seconds=cooldown),
                              time.time(), state, aggregators,
                              ScalingPolicy(scaler.min_aggregators, scaler.max_aggregators,
                                            JOBS_PER_AGGREGATOR, cooldown))
    svc.registry.set_control("autoscaler", {
        "last_change_at": state.get("last_change_at"),
        "aggregators_changed_at": state.get("aggregators_changed_at"),
        "last_decision": decision})
    watched = watchdog_once(svc)  # after the resize: a slow pass must not keep workers from starting
    emit({**decision, **watched})
    return EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    from bucketlearn.entrypoints.worker import run_learners  # noqa: PLC0415

    return run_learners()


def cmd_aggregator(args: argparse.Namespace) -> int:
    from bucketlearn.entrypoints.aggregator import main as run_aggregator  # noqa: PLC0415

    run_aggregator()
    return EXIT_OK
