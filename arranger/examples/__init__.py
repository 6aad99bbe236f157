"""Example workloads that run as Arranger jobs (a learner leader plus actor workers)."""
