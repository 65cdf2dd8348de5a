#!/usr/bin/env python3
"""imagebuild entry point: `python build.py --help`. All logic lives in imagebuild/."""

import os
import sys

# We use no pydantic plugins; discovering them scans every installed distribution's entry
# points and costs more start-up time than validating the whole matrix.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from imagebuild.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
