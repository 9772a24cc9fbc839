"""``attnhub bench``: attnhub backends and torch peers timed side by side on one GPU."""
