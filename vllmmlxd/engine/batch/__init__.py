"""The batch the step drives: ``batch.Batch`` owns mlx-lm's generator (every change and pass
goes through it, recorded as a ``step_plan.StepPlan`` and sent where ``plans`` says); ``mlxlm``
is the one module over mlx-lm's private parts; ``row_groups`` and ``grouped_attention`` keep
rows' KV in groups; ``layout`` reads what each layer keeps; ``upstream_fixes`` carries mlx-lm
bugs until mlx-lm fixes them."""

__all__ = [
    "batch",
    "batch_rows",
    "grouped_attention",
    "layout",
    "mlxlm",
    "plans",
    "row_groups",
    "step_plan",
    "upstream_fixes",
]
