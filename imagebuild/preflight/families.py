"""What a checkpoint is, read from its locked config.json the way vLLM reads it: the
architecture (`architectures[0]`, what vLLM's model registry dispatches on), the model
type, and the traits model-family rules are scoped to. A rule about Qwen3.6's Gated
DeltaNet layers or its video input applies to checkpoints that have them, whatever the
matrix calls the model.

Traits:
- `vision`: the config carries a vision tower (`vision_config`)
- `gdn`: Gated DeltaNet linear-attention layers (Qwen3-Next, Qwen3.5/3.6)
- `hybrid`: any layers with a recurrent state instead of a KV cache (GDN, Mamba, ...)

Which input modalities an architecture takes comes from vLLM itself: the `modalities`
part of the version's recorded facts (imagebuild/facts), written from its model registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from imagebuild.facts import VllmFacts

GDN_MODEL_TYPES = ("qwen3_next", "qwen3_5")  # model_type prefixes of GDN hybrids
# model types whose layers keep a recurrent state (vLLM's IsHybrid / IsAttentionFree models)
STATE_MODEL_TYPES = ("nemotron_h", "jamba", "bamba", "falcon_h1", "granitemoehybrid",
                     "zamba2", "mamba", "mamba2", "plamo2", "lfm2", "minimax", "kimi_linear")
STATE_LAYER_TYPES = ("linear_attention", "mamba", "mamba2", "conv", "recurrent")


@dataclass(frozen=True)
class Family:
    architecture: str  # e.g. Qwen3_5MoeForConditionalGeneration; "" when the config has none
    model_type: str
    traits: frozenset[str]

    @property
    def name(self) -> str:
        return self.architecture or self.model_type or "unknown architecture"


def _text(cfg: dict) -> dict:
    sub = cfg.get("text_config")
    return sub if isinstance(sub, dict) else cfg


def family(cfg: dict) -> Family:
    archs = cfg.get("architectures")
    arch = str(archs[0]) if isinstance(archs, list) and archs else ""
    model_type = str(cfg.get("model_type") or "")
    text = _text(cfg)
    text_type = str(text.get("model_type") or model_type)
    layer_types = text.get("layer_types")
    layers = {str(t) for t in layer_types} if isinstance(layer_types, list) else set()
    traits = set()
    if isinstance(cfg.get("vision_config"), dict):
        traits.add("vision")
    if text_type.startswith(GDN_MODEL_TYPES) or "linear_attention" in layers:
        traits.add("gdn")
    if ("gdn" in traits or text_type.startswith(STATE_MODEL_TYPES)
            or layers & set(STATE_LAYER_TYPES)
            or isinstance(text.get("hybrid_override_pattern"), str)):
        traits.add("hybrid")
    return Family(arch, model_type, frozenset(traits))


def modalities(fam: Family, facts: VllmFacts | None, vllm_version: str = ""
               ) -> tuple[list[str] | None, str]:
    """(the modalities vLLM takes for this architecture, how that is known); None when
    it cannot be told (no recorded facts for the version, or the answer depends on the
    config)."""
    if facts is None:
        return None, f"no recorded facts for vLLM {vllm_version}"
    table = facts.modalities
    if table is None:
        return None, facts.missing("modalities")
    vllm_version = facts.version
    if fam.architecture in table["modalities"]:
        return list(table["modalities"][fam.architecture]), (
            f"vLLM {vllm_version} takes {', '.join(table['modalities'][fam.architecture])} "
            f"for {fam.architecture}")
    if fam.architecture in table["depends_on_config"]:
        return None, f"vLLM decides {fam.architecture}'s modalities from its config"
    return [], f"{fam.name} is not a multimodal architecture of vLLM {vllm_version}"
