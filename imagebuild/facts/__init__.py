"""Facts about each vLLM version, recorded from that version's own code by one command.

    record_facts(python, out_dir) -> files   (record.py: runs recorder/ in `python`)
    facts_for(version, extra_dirs=...) -> VllmFacts | None   (store.py)

Rules read a cell's facts with `facts_for(cell.engine.vllm_version, [locked_dir(root)])`
and name them in their findings; no facts for a version is a finding naming
`record_command(version)`, never another version's answer.
"""

from imagebuild.facts.record import patch_key, record_facts
from imagebuild.facts.store import (
    PARTS,
    SHIPPED,
    VllmFacts,
    facts_for,
    locked_dir,
    record_command,
    stale_parts,
    versions,
)

__all__ = ["PARTS", "SHIPPED", "VllmFacts", "facts_for", "locked_dir", "patch_key",
           "record_command", "record_facts", "stale_parts", "versions"]
