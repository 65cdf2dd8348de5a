"""imagebuild: one matrix.yaml -> tested, tagged, rollback-able vLLM serving images."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
