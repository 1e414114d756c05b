"""Hardware and model profilers."""

from galvatron_fx.profiler.hardware import load_profile, profile_hardware

__all__ = ["load_profile", "profile_hardware"]
