"""Internal utilities (input validation)."""
