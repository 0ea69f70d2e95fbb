"""The ResourceManager: the slot manager's bookkeeping and the active resources it starts and stops."""
