"""`python -m imagebuild ...` is `build.py ...`."""

import sys

from imagebuild.cli import main

sys.exit(main())
