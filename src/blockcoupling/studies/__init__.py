"""Studies built on the engine and the store: the offline demo (more to come)."""
