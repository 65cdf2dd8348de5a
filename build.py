#!/usr/bin/env python3
"""imagebuild entry point: `python build.py --help`. All logic lives in imagebuild/."""

import sys

from imagebuild.cli import main

if __name__ == "__main__":
    sys.exit(main())
