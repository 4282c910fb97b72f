"""The agent's calculation layer: typed changes in, a node's desired state out.

Pure (no kernel, no apiserver): informers feed it one change at a time and it
recomputes only what that change reaches. :class:`PolicyCalculator` keeps a node's
policy chains and ipsets (:class:`MembershipIndex` keeps the sets' members);
:func:`changes` turns two of its answers into typed messages with explicit removals.
"""

from felix.calc.members import MembershipIndex, PodKey
from felix.calc.messages import (
    ChainRemove,
    ChainUpdate,
    IPSetRemove,
    IPSetUpdate,
    Message,
    changes,
    fold,
)
from felix.calc.policy import PolicyCalculator

__all__ = [
    "ChainRemove",
    "ChainUpdate",
    "IPSetRemove",
    "IPSetUpdate",
    "MembershipIndex",
    "Message",
    "PodKey",
    "PolicyCalculator",
    "changes",
    "fold",
]
