"""The machines a plan runs on: the records a cluster is made of (:mod:`.records`), the cluster, its
JSON form and this machine as one (:mod:`.spec`), datasheet presets (:mod:`.presets`), range checks
(:mod:`.checks`, :mod:`.limits`), this host's facts (:mod:`.host`), and where each rank sits
(:mod:`.topology`)."""

from __future__ import annotations

from galvatron_fx.cluster.records import Collective, CollectiveFit, DeviceSpec, LinkTier, TierName
from galvatron_fx.cluster.spec import PRESET_NAMES, Cluster, heterogeneous, read_json_arg

__all__ = ["PRESET_NAMES", "Cluster", "Collective", "CollectiveFit", "DeviceSpec", "LinkTier", "TierName",
           "heterogeneous", "read_json_arg"]
