"""The shared harness of the distributed tests: spawn gloo ranks once per test module, run
every case inside them, and hand each rank's results back to the test functions.

A case that raises is recorded (with its traceback) rather than aborting the others, so one
spawn reports every failure; ``assert_ok`` turns a recorded error into a test failure.
"""

from __future__ import annotations

import datetime
import faulthandler
import functools
import json
import multiprocessing
import os
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch.multiprocessing as mp

# the directory spawned ranks write a crash's Python stacks to (faulthandler), set by spawn
FAULT_DIR_ENV = "GFX_TEST_FAULT_DIR"
# Ranks start from a fork server that imported these once per test session: a rank spawned
# afresh spends seconds of CPU importing torch and transformers, on a machine whose two cores the
# ranks share (about a hundred rank starts in the suite). The modules hold no threads or process
# groups after import; every rank still builds its own process group, and runs with the
# environment of the test that spawned it (see _with_environment).
_HF_FAMILIES = ("bert", "bloom", "clip", "convnext", "deepseek_v3", "gpt2", "gpt_neox", "llama", "mamba", "mixtral",
                "olmoe", "opt", "phi", "qwen2", "qwen2_moe", "resnet", "swin", "t5", "vit")  # (tests/hf_tiny.py's)
PRELOAD = ("torch", "torch.distributed", "torch.distributed.pipelining", "transformers", "galvatron_fx.build",
           "galvatron_fx.runtime.parallel_module", "galvatron_fx.runtime.pipeline", "galvatron_fx.frontend.capture",
           "galvatron_fx.search.planner", "galvatron_fx.zoo",
           *(f"transformers.models.{f}.modeling_{f}" for f in _HF_FAMILIES))


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(rank: int, world: int, port: int) -> None:
    """Join a gloo process group of ``world`` ranks on ``port`` (one intra-op thread each)."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    faults = os.environ.get(FAULT_DIR_ENV)  # a rank killed by a signal writes where every thread was
    if faults:
        faulthandler.enable(open(f"{faults}/fault.rank{rank}.txt", "w"), all_threads=True)  # noqa: SIM115 (lives as long as the process)
    torch.set_num_threads(1)
    # a rank that fails mid-collective must not leave the others waiting for gloo's 30 minutes
    timeout = datetime.timedelta(seconds=int(os.environ.get("GFX_TEST_PG_TIMEOUT", "300")))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)


def run_jobs(rank: int, tmp: str, jobs: Iterable[tuple[str, Callable[[], dict]]], *, only_env: str | None = None) -> None:
    """Run ``(key, job)`` pairs on this rank, record results (or errors) and wall time, write
    them to ``tmp/rank{rank}.json``, leave the process group and end the process. ``only_env``
    names an environment variable holding a comma-separated subset of keys to run.

    The process ends with ``os._exit(0)``, past the interpreter's finalization: gloo's threads may
    still hold tensors whose release then aborts the process (SIGABRT) after its work is done."""
    import torch.distributed as dist

    only = os.environ.get(only_env) if only_env else None
    results: dict[str, dict] = {}
    try:
        for key, job in jobs:
            if only and key not in only.split(","):
                continue
            t0 = time.perf_counter()
            try:
                results[key] = job()
            except Exception as e:  # keep going: report every case
                results[key] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            results[key]["wall_s"] = time.perf_counter() - t0
    finally:
        Path(f"{tmp}/rank{rank}.json").write_text(json.dumps(results, indent=1))
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(worker: Callable, world: int, tmp: Path) -> dict[int, dict]:
    """``worker(rank, world, port, tmp)`` on ``world`` processes; each rank's results by rank.

    A rank killed by a signal (not a Python exception: those are recorded per case by
    :func:`run_jobs`) once every rank had written its results died on its way out: the results
    stand, with a warning. One killed earlier gets the whole spawn run again, with a warning, up to
    three runs in all: on a loaded 2-core machine a gloo rank aborts in C++ now and then (SIGABRT
    while the main thread waits on a collective; seen in the longest worlds, test_hf_models' and
    test_hf_families' world 2, twice in a row once) in runs that pass when run again. A crash in
    every run still fails."""
    files = [tmp / f"rank{r}.json" for r in range(world)]
    os.environ[FAULT_DIR_ENV] = str(tmp)  # (the ranks inherit it)
    attempts = 3
    for attempt in range(1, attempts + 1):
        for f in files:
            f.unlink(missing_ok=True)
        try:
            start(worker, (world, free_port(), str(tmp)), world)
            break
        except mp.ProcessExitedException as e:
            if e.exit_code is not None and e.exit_code >= 0:
                raise
            where = _fault_stacks(tmp, e.error_index)
            if all(f.exists() for f in files):
                warnings.warn(f"a spawned rank died by a signal after every rank recorded its results ({e}){where}",
                              stacklevel=2)
                break
            if attempt == attempts:
                raise AssertionError(f"{e}{where}") from e
            warnings.warn(f"a spawned rank died by a signal ({e}); running the spawn again ({attempt + 1} of {attempts}){where}", stacklevel=2)
    return {r: json.loads(f.read_text()) for r, f in enumerate(files)}


def _with_environment(worker: Callable, environ: dict[str, str], rank: int, *args) -> None:
    """``worker(rank, *args)`` in the environment the spawning test had (a forked rank would
    otherwise have the fork server's, fixed when the first rank started)."""
    os.environ.clear()
    os.environ.update(environ)
    worker(rank, *args)


def start(worker: Callable, args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.spawn``'s contract (``worker(rank, *args)`` on ``nprocs``
    processes, joined; a failed rank raises ``ProcessExitedException`` / ``ProcessRaisedException``),
    the ranks forked from the session's fork server (see :data:`PRELOAD`)."""
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    mp.start_processes(functools.partial(_with_environment, worker, dict(os.environ)), args=args, nprocs=nprocs,
                       start_method="forkserver")


def _fault_stacks(tmp: Path, rank: int) -> str:
    """The Python stacks a rank killed by a signal wrote (its faulthandler file), or ""."""
    f = tmp / f"fault.rank{rank}.txt"
    text = f.read_text(errors="replace").strip() if f.exists() else ""
    if len(text) > 6000:  # the first threads (the one that crashed is marked "Current thread") and the main one
        text = f"{text[:3000]}\n[...]\n{text[-3000:]}"
    return f"\nwhere rank {rank} was:\n{text}" if text else ""


def assert_ok(results: dict[int, dict], key: str) -> dict:
    """Fail with the recorded error if any rank's case raised; rank 0's result otherwise."""
    for rank, by_case in results.items():
        r = by_case[key]
        assert "error" not in r, f"rank {rank}: {r.get('error')}\n{r.get('trace')}"
    return results[0][key]


def config_error(fn) -> str:
    """``"ConfigError: <message>"`` if ``fn()`` raises one, else ``"no error"`` (other exceptions
    propagate): a rank's outcome, to compare across ranks."""
    from galvatron_fx.errors import ConfigError

    try:
        fn()
    except ConfigError as e:
        return f"ConfigError: {e}"
    return "no error"
