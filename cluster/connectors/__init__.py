"""Where streams come from and go to: generator and testing sources, files, Redis Streams, sinks."""
