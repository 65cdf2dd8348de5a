"""Smoke tests: prove a built serve image serves correctly before anything ships (issue 4).

Entry points: `smoke_ref` (one image by reference) and `smoke_cells` (a tag's cells).
"""

from imagebuild.smoke.expect import expectations_for, expectations_from_labels
from imagebuild.smoke.runner import smoke_cells, smoke_image, smoke_ref

__all__ = ["expectations_for", "expectations_from_labels", "smoke_cells", "smoke_image",
           "smoke_ref"]
