"""tabbyctl package."""
