"""inductionlab: find, measure, remove and grow induction heads in causal language models."""

__version__ = "0.1.0"
