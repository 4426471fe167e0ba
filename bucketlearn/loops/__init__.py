"""The long-running loops of the deployment's processes but the aggregator: the learner (and its
segments, its heartbeat, its parent's recycling), the autoscaler and the watchdog."""
