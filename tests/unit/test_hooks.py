"""The runtime's hook lists: around-hooks called outermost first, each given the call to go on with."""

from __future__ import annotations

from galvatron_fx.runtime.hooks import Hooks


def test_step_hooks_wrap_the_step_outermost_first_and_can_be_removed():
    seen: list[str] = []
    hooks = Hooks()

    def outer(call, batch, optimizer, **kw):
        seen.append("outer in")
        loss = call(batch, optimizer, **kw)
        seen.append("outer out")
        return loss + 1

    def inner(call, batch, optimizer, **kw):
        seen.append(f"inner {batch} {optimizer} {kw}")
        return call(batch, optimizer, **kw) * 10

    def step(batch, optimizer, **kw):
        seen.append("step")
        return 2

    hooks.step += [outer, inner]
    assert hooks.run_step(step, "b", "opt", max_norm=1.0) == 21
    assert seen == ["outer in", "inner b opt {'max_norm': 1.0}", "step", "outer out"]
    Hooks.remove(hooks.step, outer)
    Hooks.remove(hooks.step, outer)  # (absent: nothing happens)
    assert hooks.run_step(step, "b", "opt") == 20


def test_layer_and_sync_hooks_see_the_layer_name_and_the_call():
    hooks = Hooks()
    names: list[str] = []
    hooks.layer.append(lambda name, call, *xs: (names.append(name), call(*xs))[1])
    assert hooks.run_layer("blocks.0", lambda a, b: a + b, 2, 3) == 5
    assert names == ["blocks.0"]
    order: list[str] = []
    hooks.sync.append(lambda call: (order.append("before"), call(), order.append("after")))
    hooks.run_sync(lambda: order.append("sync"))
    assert order == ["before", "sync", "after"]
