"""Framework autograd glue: wraps a backend's forward and backward for torch, TensorFlow and JAX."""
