"""cni package."""
