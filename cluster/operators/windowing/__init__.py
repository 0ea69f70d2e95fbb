"""Windows over keyed streams: the window operator, its triggers, per-function window contents,
session merging, sliding windows kept per slice, the pre-aggregation (Arrow or pandas), watermarks
and timestamps. The assigners are part of the job's description (cluster.graph.windows); the timer
service is the keyed operators' (cluster.operators.timers)."""
