"""Clusters started from the client side: the embedded local cluster, the HA cluster, standalone processes (as dask's distributed.deploy)."""
