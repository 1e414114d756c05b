"""A hardware profile of this machine written into a cache directory, as ``galvatron-fx profile``
records it (its machine fields, their fingerprint, the fitted cluster): what
``Cluster.local_cpu`` trusts."""

from __future__ import annotations

import json
import os
from pathlib import Path

from galvatron_fx.cluster.host import cpu_model, fingerprint_fields, make_fingerprint


def write_cached_profile(cache_dir, cluster, world_size: int, **field_changes) -> Path:
    """``cluster`` as this machine's cached profile for ``world_size`` gloo processes;
    ``field_changes`` record other machine fields (a profile of another machine under this
    machine's file name)."""
    here = fingerprint_fields(num_hosts=1, device_model=cpu_model(), devices_per_host=os.cpu_count() or 1,
                              backend="gloo", world_size=world_size)
    fields = {**here, **field_changes}
    path = Path(cache_dir) / f"hardware-{make_fingerprint(here)}.json"
    path.write_text(json.dumps({"fingerprint": make_fingerprint(fields), "fingerprint_fields": fields,
                                "cluster": cluster.to_dict()}))
    return path
