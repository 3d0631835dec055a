"""A run's memory estimate made from its model's measured profile (:mod:`workbench.runs.profile`, issue 26).

:func:`estimate_with_profile` puts the profile's activations at the run's micro-batch into the run's estimate
(:func:`~workbench.runs.estimate.estimate_run_memory`) instead of the closed formula (the built-in LM) or the
logits (a user's model); in JAX, also what XLA holds of the update beside the backward's peak, where a rank
updates the whole state (DDP, or one rank): a rank updating its shard (fsdp-row, -flat, -full) updates after its
reduce-scatters, and XLA held none of the update there beside backward. Measured on 2 ranks: the built-in LM
(d=256, 13 MiB of parameters, 18.7 MiB of the update beside backward on one process) read 1.05-1.06 of a row or
flat prediction without that term and 0.88-0.89 with half of it; full sharding 0.94-1.08 against 0.84-0.97; DDP
needs it (the Qwen3-shaped LM at 128 tokens read 1.09-1.12 without, 1.02-1.05 with).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from workbench.estimate.breakdown import MemoryComponent, MemoryEstimate
from workbench.models.init import LMConfig
from workbench.runs.estimate import estimate_run_activation_bytes, estimate_run_memory, units_recomputed
from workbench.runs.profile import ModelProfile, profile_key_fields
from workbench.strategies import get_strategy


#: Key fields that decide the activations (threads and versions change times, not which arrays exist).
MODEL_FIELDS = ("model", "precision", "seq_len", "vocab_size", "framework")


def estimate_with_profile(spec: Any, profile: ModelProfile, model_shapes: Any = None) -> MemoryEstimate:
    """:func:`~workbench.runs.estimate.estimate_run_memory` with the profile's activations for the run's micro-batch.

    The profile measured the whole model's backward with nothing recomputed, and, for an MLX model with transformer
    blocks, the ZeRO-3 trainer's step on a group of one. Where the run's strategy recomputes its units in backward
    (MLX's ZeRO-3 resharding after forward: :func:`~workbench.runs.estimate.units_recomputed`), the activations are
    that step's rise less what the estimate holds beside them on one rank (the gradients and the unit's buffers):
    an ordered step frees what one lazy backward keeps (the attention example's fsdp-full peak read 1.11x a
    prediction from the kept activations, mlx-lm's Llama and Qwen3 0.80 and 0.88x one from blocks recomputed by
    ``nn.utils.checkpoint``). Without that measure, the built-in LM's are scaled by the closed formula's ratio of
    recomputed to kept activations, and a user model's are the kept ones.

    Raises:
        ValueError: ``profile`` is of another model, dtype, sequence length, vocabulary or framework (named).
    """
    fields = spec if isinstance(spec, Mapping) else spec.to_dict()
    want = profile_key_fields(fields, None)
    wrong = [name for name in MODEL_FIELDS if want[name] != profile.key_fields.get(name)]
    if wrong:
        raise ValueError(f"the profile {profile.key} is of another {', '.join(wrong)} than this run ("
                         + "; ".join(f"{n}: {profile.key_fields.get(n)!r}, not {want[n]!r}" for n in wrong) + ")")
    base = estimate_run_memory(fields, model_shapes)
    b = fields["global_batch"] // (fields["num_ranks"] * fields.get("num_microbatches", 1))
    activations = profile.activation_bytes_at(b, fields["num_ranks"])
    fit = profile.activation_fit_for(fields["num_ranks"])
    how = (f"profiled: {fit.slope:,.0f} B x {b} sequences + {fit.intercept:,.0f} B"
           + (" (the truth at XLA's plan on a mesh of two over its plan on one device)"
              if fit is profile.mesh_activation_fit else ""))
    if units_recomputed(fields) and profile.zero3_rise_fit is not None:
        one = estimate_run_memory({**fields, "num_ranks": 1, "global_batch": b * fields.get("num_microbatches", 1)},
                                  model_shapes)
        held = one["gradients"] + one["gathered_unit"]
        activations = max(0, round(profile.zero3_rise_fit.at(b)) - held)
        how = (f"profiled ZeRO-3 step on one rank: its rise {profile.zero3_rise_fit.slope:,.0f} B x {b} sequences + "
               f"{profile.zero3_rise_fit.intercept:,.0f} B, less its gradients and unit buffers ({held:,} B)")
    elif fields.get("model_factory") is None:
        kept = estimate_run_activation_bytes(LMConfig(**fields["model"]), b, fields["precision"])
        if base["activations"] != kept and kept:
            activations = round(activations * base["activations"] / kept)
            how += f", x {base['activations'] / kept:.3f} (blocks recomputed in backward, closed formula's ratio)"
    beside = profile.update_beside_backward_bytes
    updates_a_shard = get_strategy(fields["strategy"]).sharded.optimizer and base.num_shards > 1
    if beside and not updates_a_shard:  # JAX, a rank updating the whole state
        activations += beside
        how += f", + {beside:,} B of the update beside backward (whole step profiled)"
    rows = tuple(MemoryComponent("activations", activations, how) if c.name == "activations" else c
                 for c in base.components)
    return replace(base, components=rows)
