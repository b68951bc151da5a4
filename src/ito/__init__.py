"""ito-training: the canonical runtime for training on GPU nodes booked through Itô."""

__version__ = "0.1.0"
