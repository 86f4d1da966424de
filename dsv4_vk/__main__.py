"""`python -m dsv4_vk <command>` (the `dsv4_vk` console script is the same)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
