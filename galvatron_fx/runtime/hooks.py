"""The hook lists a running module offers to what watches or steers it from outside.

Contract: every parallel module (and every pipeline chunk's body, which shares its pipeline's
lists) holds one :class:`Hooks`. Each list holds *around* hooks, called outermost first, each
given the call to continue with:

- ``step``: ``hook(call, batch, optimizer, **kw) -> loss`` around each ``train_step``;
- ``layer``: ``hook(name, call, *xs) -> outputs`` around each layer's call (``name``: the layer's);
- ``sync``: ``hook(call) -> None`` around each data-parallel gradient sync of a step.

Observation (:mod:`galvatron_fx.runtime.observe`) appends to them while it records, and the closed
loop (:mod:`galvatron_fx.adapt`) adds a step hook; nothing replaces a module's methods. Empty lists
cost one truth test per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Hooks"]


@dataclass(eq=False)
class Hooks:
    """The around-hooks of one module (see module doc)."""

    step: list[Callable[..., Any]] = field(default_factory=list)
    layer: list[Callable[..., Any]] = field(default_factory=list)
    sync: list[Callable[..., Any]] = field(default_factory=list)

    def run_step(self, call: Callable[..., Any], batch, optimizer, **kw):
        for hook in reversed(self.step):
            call = functools.partial(hook, call)
        return call(batch, optimizer, **kw)

    def run_layer(self, name: str, call: Callable[..., Any], *xs):
        for hook in reversed(self.layer):
            call = functools.partial(hook, name, call)
        return call(*xs)

    def run_sync(self, call: Callable[[], None]) -> None:
        for hook in reversed(self.sync):
            call = functools.partial(hook, call)
        call()

    @staticmethod
    def remove(hooks: list, hook) -> None:
        """``hook`` out of ``hooks`` when it is there."""
        if hook in hooks:
            hooks.remove(hook)
