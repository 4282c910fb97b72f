"""datastore package."""
