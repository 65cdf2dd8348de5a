"""Where the tests' data lives."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
DATA = TESTS / "data"
CONFIGS = DATA / "configs"  # model and drafter config.json shapes
HUB_DATA = DATA / "hub"  # recorded Hub answers
CUDA = DATA / "cuda"  # tiny CUDA sources for the arch gate
GOLDEN = DATA / "golden"  # rendered files rendered/ cannot hold (pins locked from HUB_DATA)
GOLDEN_EXAMPLES = DATA / "golden-examples"
ORACLE = TESTS / "support" / "vllm_oracle"  # scripts the vLLM oracle venv runs
