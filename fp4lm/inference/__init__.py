"""A finished or running training run read back from its directory: `fp4lm eval` (saved_run.py) and
`fp4lm sample` (sample.py). Read only; above the trainer, whose checkpoint format and step it reuses."""
