"""What every process of the cluster shares and that depends on nothing else of it: the clock, how a failure reads, process logging, process launch."""
