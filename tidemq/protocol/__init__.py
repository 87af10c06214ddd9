"""Network protocols over the broker."""
