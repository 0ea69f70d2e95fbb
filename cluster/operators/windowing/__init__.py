"""Windows over keyed streams: the window operator, its triggers, per-function window contents,
session merging, the pandas pre-aggregation, watermarks and timestamps. The assigners are part of
the job's description (cluster.graph.windows); the timer service is the keyed operators'
(cluster.operators.timers)."""
