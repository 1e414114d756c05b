"""User-facing errors. Each message says what happened and what to try."""

from __future__ import annotations


class GalvatronError(Exception):
    """Base class of every error galvatron_fx raises on purpose."""


class CaptureError(GalvatronError):
    """The model could not be traced to a graph."""


class UnsupportedModelError(CaptureError):
    """The model uses an op or construct that the capture does not handle."""


class ConfigError(GalvatronError, ValueError):
    """A configuration, cluster description or file is malformed or impossible."""


class PlanError(GalvatronError):
    """No plan fits, or a plan does not match the model, cluster or world size."""


class RankFailureError(GalvatronError):
    """A peer rank stopped answering (stopped, hung, or died) during a collective; raised on
    every surviving rank, naming the ranks that did not answer."""


class NonFiniteLossError(GalvatronError):
    """Training met more non-finite losses (or gradient norms) than it was told to skip; the
    parameters were not stepped on them."""


class PrecisionError(GalvatronError):
    """Training cannot go on in the plan's precision: its values overflow it (fp16's range)."""
