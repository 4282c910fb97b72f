"""The agent's calculation layer: typed changes in, a node's desired state out.

Pure (no kernel, no apiserver): informers feed it one change at a time and it
recomputes only what that change reaches. :class:`PolicyCalculator` keeps a node's
policy chains and ipsets (:class:`MembershipIndex` keeps the sets' members).
"""

from felix.calc.members import MembershipIndex, PodKey
from felix.calc.policy import PolicyCalculator

__all__ = ["MembershipIndex", "PodKey", "PolicyCalculator"]
