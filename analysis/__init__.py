"""From run directories to figures and tables."""
