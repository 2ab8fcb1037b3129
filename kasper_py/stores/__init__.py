"""State stores: one protocol, one module per backend."""
