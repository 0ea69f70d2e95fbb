"""Talking to a cluster: cluster info, the JobClient and its job handles, results, events, the leader."""
