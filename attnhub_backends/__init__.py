"""attnhub's built-in backends, importable as ``attnhub_backends.<name>``."""
