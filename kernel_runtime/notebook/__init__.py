"""streamlab in a notebook: the magics and their arguments, cells, the lab registry, widgets."""
