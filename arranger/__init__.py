"""Arranger schedules distributed reinforcement-learning jobs on plain GPU machines."""

__version__ = "0.4.0"
