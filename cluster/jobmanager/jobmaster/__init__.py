"""One JobMaster per job: the networked shell, the pure scheduler and its checkpointing, the restart strategy."""
