"""felix package."""
