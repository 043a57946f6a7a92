"""``python -m inductionlab.cli``."""

from .main import main

main()
