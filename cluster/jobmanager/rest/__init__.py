"""The JobManager's REST API, Flink's paths and bodies: server, security, handlers, views, forwarding to the leader."""
