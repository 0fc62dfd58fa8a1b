"""Training: state, loss scaling, optimizer, the jitted step, the loop, checkpoints, metrics, sampling.

`train(config)` runs (or resumes) a training run; fp4lm.inference reads a saved one back.
"""

from fp4lm.train.loop import train

__all__ = ["train"]
