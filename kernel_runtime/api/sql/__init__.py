"""Spark SQL over a stream, as Spark Structured Streaming and Flink SQL mean it: a query that only
projects and filters runs per batch on the TaskManagers' Spark; one whose result spans batches is
planned from Spark's own analysed logical plan into a Spark step per batch plus streamlab's
stateful operators (see planner.py)."""
