"""Hardware and model profilers."""

from galvatron_fx.profiler.hardware import profile_hardware
from galvatron_fx.profiler.hardware_profile import load_profile

__all__ = ["load_profile", "profile_hardware"]
