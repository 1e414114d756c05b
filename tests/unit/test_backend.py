"""The ``galvatron_fx`` Dynamo backend in one process: it is registered, it equals eager (loss,
gradients, AdamW steps; graph breaks allowed), its options are checked with errors that say what
to do, it maps Dynamo's graph inputs to the user's names, its captured graph segments like the
eager model's (so saved plans lock onto it), it refuses graphs the parallel runtime cannot run,
and ``dump_dir`` writes the graph and a runnable plan."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.errors import CaptureError, ConfigError
from galvatron_fx.frontend.backend import BackendOptions, galvatron_fx_backend
from galvatron_fx.frontend.dynamo_graph import GraphSignature, check_whole_graph, source_path, to_shell

T = 16
STEPS = 3


def _model(name: str, batch: int = 4):
    return zoo.build(name, batch_size=batch, seq_len=T, device="cpu", seed=0)


def _batches(n: int, batch: int = 4):
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, 64, (batch, T), generator=g), torch.randint(0, 64, (batch, T), generator=g))
            for _ in range(n)]


def _graphs(model, *inputs) -> list[tuple[torch.fx.GraphModule, list]]:
    """The graphs Dynamo hands a backend for ``model(*inputs)``, with their example inputs."""
    seen = []

    def record(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=record)(*inputs)
    return seen


class _Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, y):
        h = self.a(x)
        torch._dynamo.graph_break()
        return F.mse_loss(self.b(h), y)


class _Logits(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_backend_is_registered():
    assert "galvatron_fx" in torch._dynamo.list_backends(exclude_tags=())


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_one_process_trains_like_eager(name):
    model, _ = _model(name)
    ref, mine = copy.deepcopy(model), copy.deepcopy(model)
    cmodel = torch.compile(mine, backend="galvatron_fx")
    opt = torch.optim.AdamW(mine.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    for step, batch in enumerate(_batches(STEPS)):
        loss, want = cmodel(*batch), ref(*batch)
        assert abs(loss.item() - want.item()) <= 1e-6
        loss.backward()
        want.backward()
        for (k, p), q in zip(mine.named_parameters(), ref.parameters()):
            assert p.grad is not None, f"{k} got no gradient"
            assert (p.grad - q.grad).abs().max().item() <= 1e-6, f"step {step}: gradient of {k} differs"
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    moved = max((p - q).abs().max().item() for p, q in zip(ref.parameters(), model.parameters()))
    assert moved > 1e-3, "the optimizer did not move the parameters: the test cannot fail"
    for (k, p), q in zip(mine.named_parameters(), ref.parameters()):
        assert (p - q).abs().max().item() <= 1e-6, f"parameter {k} differs after {STEPS} steps"


def test_one_process_allows_graph_breaks():
    model = _Broken()
    ref = copy.deepcopy(model)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    loss = torch.compile(model, backend="galvatron_fx")(x, y)
    want = ref(x, y)
    assert torch.equal(loss, want)
    loss.backward()
    want.backward()
    assert torch.equal(model.a.weight.grad, ref.a.weight.grad)


# ---- options ------------------------------------------------------------------------------------

def test_options_default_to_a_constrained_search():
    opts = BackendOptions.parse(None)
    assert opts.search.pp == (1,) and opts.search.num_microbatches == (1,) and opts.search.dp_types == ("ddp",)
    opts = BackendOptions.parse({"search": {"tp": (1, 2), "recompute": ("none",)}, "cluster": "dgx-a100-80g",
                                 "memory_budget": 8e9, "global_batch_size": 8, "dump_dir": "out", "name": "gpt"})
    assert opts.search.tp == (1, 2) and opts.search.pp == (1,)
    assert opts.cluster.world_size == gfx.Cluster.preset("dgx-a100-80g").world_size
    assert opts.memory_budget == 8_000_000_000 and isinstance(opts.memory_budget, int)


@pytest.mark.parametrize("options,match", [
    ({"clustr": "dgx-a100-80g"}, r"unknown option.*'clustr' \(did you mean 'cluster'\?\)"),
    ({"cluster": "no-such-machine"}, r"unknown cluster preset 'no-such-machine'; choose one of"),
    ({"cluster": "missing.json"}, r"no such cluster JSON file"),
    ({"cluster": 3}, r"cluster= takes a galvatron_fx.Cluster"),
    ({"global_batch_size": 0}, r"global_batch_size=0.*an int >= 1"),
    ({"global_batch_size": True}, r"global_batch_size=True"),
    ({"memory_budget": -1}, r"memory_budget=-1.*positive number of bytes"),
    ({"plan": "missing-plan.json"}, r"plan file 'missing-plan.json' does not exist"),
    ({"plan": 5}, r"plan= takes a ParallelPlan or the path"),
    ({"search": {"pp": (2,)}}, r"without pipeline stages; drop 'pp'"),
    ({"search": {"num_microbatches": (4,)}}, r"one micro-batch.*galvatron_fx.compile"),
    ({"search": {"dp_types": ("zero3",)}}, r"only 'ddp' runs.*galvatron_fx.compile"),
    ({"search": {"no_such_field": 1}}, r"search=.*SearchSpace"),
    ({"dump_dir": 1}, r"dump_dir= takes a directory"),
    ({"name": ""}, r"name= takes a non-empty string"),
    ("cluster", r"must be a dict"),
])
def test_bad_options_say_what_to_do(options, match):
    with pytest.raises(ConfigError, match=match):
        BackendOptions.parse(options)


def test_plan_locks_out_search_options(tmp_path):
    model, inputs = _model("gpt-tiny")
    mg = gfx.capture(model, inputs)
    plan = gfx.plan(mg, gfx.Cluster.local_cpu(2), global_batch_size=4, search={"pp": (1,), "tp": (1,)},
                    baselines=False)
    path = plan.save(tmp_path / "plan.json")
    assert BackendOptions.parse({"plan": str(path)}).plan.plan_hash() == plan.plan_hash()
    with pytest.raises(ConfigError, match="plan= locks the strategy.*drop search"):
        BackendOptions.parse({"plan": plan, "search": {"tp": (2,)}})


def test_option_errors_surface_through_torch_compile():
    model, inputs = _model("gpt-tiny")
    with pytest.raises(Exception, match="unknown option") as info:
        torch.compile(model, backend="galvatron_fx", options={"clustr": "dgx-a100-80g"})(*inputs)
    assert isinstance(getattr(info.value, "inner_exception", info.value), ConfigError)


# ---- the graph Dynamo hands over ----------------------------------------------------------------

@pytest.mark.parametrize("name,want", [
    ("L['self']._modules['blocks']._modules['0']._parameters['weight']", ("self", ["blocks", "0", "weight"])),
    ("L['self'].blocks[0].attn.qkv.weight", ("self", ["blocks", "0", "attn", "qkv", "weight"])),
    ("L['self']._modules['rope']._buffers['cos']", ("self", ["rope", "cos"])),
    ("G['model']._modules['head']._parameters['bias']", ("model", ["head", "bias"])),
    ("L['idx']", ("idx", [])),
    ("L['batch'][0]", ("batch", ["0"])),
    ("L['self'].blocks.0", ("self", ["blocks", "0"])),
    ("___odict_getitem(L['self'], 'x')", None),
])
def test_source_paths(name, want):
    assert source_path(name) == want


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_signature_names_inputs_and_state_as_the_user_does(name):
    model, inputs = _model(name)
    ((gm, ex),) = _graphs(model, *inputs)
    sig = GraphSignature.of(gm, ex)
    assert sig.input_names == ("idx", "targets") and sig.roots == ("self",) and not sig.unmapped
    named = dict(model.named_parameters()) | dict(model.named_buffers())
    assert {fqn for _, fqn in sig.state} <= set(named)
    for i, fqn in sig.state:
        assert ex[i] is named[fqn], f"graph input {i} is not the user's {fqn}"
    params = {fqn for _, fqn in sig.state if isinstance(named[fqn], nn.Parameter)}
    assert params == set(dict(model.named_parameters()))  # tied weights once, under their first name
    check_whole_graph(gm, ex, sig)  # a whole graph passes


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_shell_captures_the_layers_of_the_eager_model(name):
    """Same layers, kinds and node names as capturing the model itself: a plan made with
    galvatron_fx.plan(model, ...) names the nodes the backend's executors run."""
    model, inputs = _model(name)
    ((gm, ex),) = _graphs(model, *inputs)
    sig = GraphSignature.of(gm, ex)
    shell = to_shell(gm, sig, ex)
    named = dict(shell.named_parameters())
    assert all(named[k] is p for k, p in model.named_parameters() if k in named)
    got = gfx.capture(shell, [ex[i] for i in sig.inputs], annotate=False)
    want = gfx.capture(model, inputs, annotate=False)
    assert [(l.name, l.kind, l.role) for l in got.layers] == [(l.name, l.kind, l.role) for l in want.layers]
    assert [l.node_names for l in got.layers] == [l.node_names for l in want.layers]
    assert set(got.params) == set(want.params)
    assert torch.equal(shell(*inputs)[0], model(*inputs))


def test_graph_breaks_are_refused_for_the_parallel_runtime():
    (first, ex1), (second, ex2) = _graphs(_Broken(), torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(CaptureError, match=r"split by a graph break at .*test_backend.py.*fullgraph=True"):
        check_whole_graph(first, ex1, GraphSignature.of(first, ex1))
    with pytest.raises(CaptureError, match=r"resumes after a graph break.*galvatron_fx.compile"):
        check_whole_graph(second, ex2, GraphSignature.of(second, ex2))


def test_outputs_other_than_one_scalar_loss_are_refused():
    ((gm, ex),) = _graphs(_Logits(), torch.randn(4, 8))
    with pytest.raises(CaptureError, match=r"returns \(a tensor of shape \(4, 8\)\).*returns the loss"):
        check_whole_graph(gm, ex, GraphSignature.of(gm, ex))


def test_dynamic_shapes_are_refused():
    model, _ = _model("gpt-tiny")
    seen = []

    def record(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    cmodel = torch.compile(model, backend=record, dynamic=True)
    cmodel(*_batches(1, batch=4)[0])
    gm, ex = seen[-1]
    with pytest.raises(CaptureError, match=r"dynamic shapes \(graph input L\['idx'\]\.size\(\)\[0\]\).*dynamic=False"):
        check_whole_graph(gm, ex, GraphSignature.of(gm, ex))


def test_one_process_returns_dynamos_graph_as_is():
    model, inputs = _model("gpt-tiny")
    ((gm, ex),) = _graphs(model, *inputs)
    fn = galvatron_fx_backend(gm, ex)
    assert fn == gm.forward  # eager: Dynamo's graph as it is


# ---- dumps ----------------------------------------------------------------------------------------

def test_dump_dir_writes_the_graph_and_a_runnable_plan(tmp_path):
    model, inputs = _model("gpt-tiny")
    ref = copy.deepcopy(model)
    options = {"dump_dir": str(tmp_path), "cluster": gfx.Cluster.local_cpu(2), "name": "gpt-tiny"}
    loss = torch.compile(model, backend="galvatron_fx", options=options)(*inputs)
    assert torch.equal(loss, ref(*inputs))
    (d,) = list(tmp_path.iterdir())
    assert (d / "passes").is_dir() and any((d / "passes").iterdir())
    table = (d / "layers.txt").read_text()
    assert "blocks.3" in table and "embedding" in table
    plan = gfx.ParallelPlan.load(d / "plan.json")
    assert plan.model == "gpt-tiny" and plan.world_size == 2 and plan.global_batch_size == 4
    assert plan.pp == 1 and plan.num_microbatches == 1
    assert {str(lp.strategy.dp_type) for lp in plan.layers} == {"ddp"}
    assert "plan for gpt-tiny" in (d / "plan.txt").read_text()
