"""The streamlab command: run, list, cancel, savepoint, export, application mode, standalone processes."""
