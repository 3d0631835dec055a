"""The plan advisor (issue 27): the plan that fits a memory budget and is fastest, and its proof on real runs.

    advice = advise_plan("lm", num_ranks=2, memory_bytes=24 * GiB, global_batch=16, runs_root="runs")
    advice.recommended.label, advice.recommended.predicted_step_s
    validation = validate_plan(advice, "runs")   # the pick, the runner-up and DDP, run for real
"""

from workbench.studies.planner.advise import SAFETY_MARGIN, PlanAdvice, advise_plan, base_spec, placement_links
from workbench.studies.planner.candidates import Candidate, enumerate_candidates
from workbench.studies.planner.validate import Validated, Validation, validate_plan, validation_plans

__all__ = ["Candidate", "PlanAdvice", "SAFETY_MARGIN", "Validated", "Validation", "advise_plan", "base_spec",
           "enumerate_candidates", "placement_links", "validate_plan", "validation_plans"]
