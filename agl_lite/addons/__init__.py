"""Built-in addons, one per module; they never import each other (they talk through flow.metadata)."""
