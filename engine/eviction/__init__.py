"""KV eviction: which positions each (layer, KV head) keeps, by a policy defined as NVIDIA kvpress 0.5.5
defines it (`policies`), applied after the prefill or during decode to a budget (`run`, `budgets`, `evict`,
`rerotation`, `settings`), read through a mask (`rows`); a text's teacher-forced NLL through an evicting cache
(`nll`)."""

from engine.eviction.budgets import DecodeBudget, StreamingWindow
from engine.eviction.nll import forced_nll, stream_nll
from engine.eviction.policies import EVICTION_POLICIES, Policy, n_kept_for_ratio
from engine.eviction.records import Eviction, EvictionStep
from engine.eviction.run import EvictionRun

__all__ = [
    "EVICTION_POLICIES",
    "DecodeBudget",
    "Eviction",
    "EvictionRun",
    "EvictionStep",
    "Policy",
    "StreamingWindow",
    "forced_nll",
    "n_kept_for_ratio",
    "stream_nll",
]
