"""Scheduling: candidates -> filters -> scorers -> picker, one profile per policy.

scheduler.py builds the candidates of one request and runs its profile (profiles.py); the
filters (filters.py), scorers (scorers/, one module each, all in prefill tokens) and pickers
(picker.py) are the profile's parts.
"""

from .candidate import Ask, Candidate, Decision
from .scheduler import Scheduler

__all__ = ["Ask", "Candidate", "Decision", "Scheduler"]
