"""One rank of a fault scenario of ``test_faults.py``: ``python fault_worker.py SCENARIO RANK WORLD PORT DIR``.

Every scenario compiles gpt-tiny for world 2 (plan searched on rank 0, dp×tp), trains on fixed
batches and writes ``DIR/SCENARIO.rank{R}.json`` with what happened (the error's type and
message, seconds from the fault to the error) as it ends. Scenarios:

- ``kill_step``: rank 1 says (``DIR/kill_step.ready``) it is training; the parent SIGKILLs it.
- ``stop``: rank 1 stops itself (SIGSTOP) before step 3; rank 0 must end within the timeout.
- ``kill_save``: both save a checkpoint after step 2 (rank 0 keeps the full state in
  ``DIR/before.pt``), train a step, save again into the same path; rank 1 dies (SIGKILL) while
  DCP writes its files.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

TIMEOUT_S = 3.0
# GFX_FAULT_TIMEOUT: compile(timeout=) itself, as a user sets it (no shorter limit set after building)
COMPILE_TIMEOUT_S = float(os.environ.get("GFX_FAULT_TIMEOUT", "0")) or None


def _setup(rank: int, world: int, port: int):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    import galvatron_fx as gfx
    from galvatron_fx import zoo
    from galvatron_fx.runtime.guard import set_timeout

    model, inputs = zoo.build("gpt-tiny", batch_size=4, seq_len=16, seed=0)
    # building waits longer (ranks of a loaded 2-core machine drift apart); the steps TIMEOUT_S
    pm = gfx.compile(model, gfx.Cluster.local_cpu(world), inputs, global_batch_size=4, search={"pp": (1,)},
                     timeout=COMPILE_TIMEOUT_S or 60)
    if COMPILE_TIMEOUT_S is None:
        set_timeout(TIMEOUT_S)
    g = torch.Generator().manual_seed(1)
    batches = [tuple(torch.randint(0, model.config.vocab_size, x.shape, generator=g) for x in inputs)
               for _ in range(4)]
    return pm, torch.optim.AdamW(pm.parameters(), lr=1e-3), batches


def main(scenario: str, rank: int, world: int, port: int, out: Path) -> None:
    import torch

    import galvatron_fx as gfx
    from galvatron_fx.runtime import checkpoint as ck

    record: dict = {"steps": 0}
    t_fault = None
    try:
        pm, opt, batches = _setup(rank, world, port)
        if scenario == "kill_step":
            for step in range(10_000):
                if step == 2 and rank == 1:
                    (out / "kill_step.ready").write_text("training")
                t_fault = time.monotonic()
                pm.train_step(batches[step % 4], opt)
                record["steps"] = step + 1
        elif scenario == "stop":
            for step in range(6):
                if step == 2 and rank == 1:
                    os.kill(os.getpid(), signal.SIGSTOP)
                t_fault = time.monotonic()
                pm.train_step(batches[step % 4], opt)
                record["steps"] = step + 1
        elif scenario == "kill_save":
            for step in range(2):
                pm.train_step(batches[step], opt)
            path = out / "ckpt"
            ck.save(pm, opt, path, step=2)
            state = pm.state_dict()
            if rank == 0:
                torch.save({k: v.clone() for k, v in state.items()}, out / "before.pt")
            pm.train_step(batches[2], opt)
            if rank == 1:
                from torch.distributed.checkpoint import FileSystemWriter

                def die(self, *args, **kwargs):
                    os.kill(os.getpid(), signal.SIGKILL)

                FileSystemWriter.write_data = die
            t_fault = time.monotonic()
            ck.save(pm, opt, path, step=3)
            record["second_save"] = "finished"
        else:
            raise ValueError(f"unknown scenario {scenario!r}")
        record["outcome"] = "finished"
    except gfx.GalvatronError as e:
        record.update(outcome=type(e).__name__, message=str(e))
    except Exception as e:  # what the test must not see
        record.update(outcome=type(e).__name__, message=str(e), trace=traceback.format_exc()[-3000:])
    if t_fault is not None:
        record["fault_to_error_s"] = time.monotonic() - t_fault
    (out / f"{scenario}.rank{rank}.json").write_text(json.dumps(record, indent=1))
    sys.stdout.flush()
    os._exit(0)  # no teardown collective with a dead or stopped peer


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
