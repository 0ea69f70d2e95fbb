"""Wire protocol shared by every streamlab process: messages, codec, endpoints, auth."""
