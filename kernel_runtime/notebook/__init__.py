"""streamlab in a notebook: the magics and their arguments, cells, the lab registry, widgets.

Importing it registers what a notebook adds to the client (client_hooks): the client package
never imports this one.
"""
from kernel_runtime.notebook import client_hooks

client_hooks.install()
