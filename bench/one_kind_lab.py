"""``python -m lab.labctl`` with every host of the kind a ``--shared`` lab's hosts are, each on its own environment.

    PYTHONPATH=<checkout> python -P bench/one_kind_lab.py up N --subnet S     (down, status: as lab.labctl)

The counterpart bench/deploy --one-kind compares a ``./lab/up N --shared N`` lab with: the same N hosts (kind
``lab.kinds.SHARED_KIND``, mi210-rocm7), but each with its own /opt/venv as a plain ``./lab/up`` gives it, instead
of the kinds cycling (a 16-host ``./lab/up`` has 11 gfx90a hosts on two ROCm versions and 5 gfx942 hosts). The lab
itself is unchanged: only its choice of kind per host is replaced, before labctl runs.
"""

from __future__ import annotations

import dataclasses
import sys

from lab import kinds, labctl

plan_shared_kind = kinds.plan_host


def plan_host(index: int, subnet: str, aiter: str = "wheel", shared: int = 0) -> kinds.PlannedHost:
    """Host ``index`` as a --shared lab plans it (kind SHARED_KIND), but not sharing its environment."""
    return dataclasses.replace(plan_shared_kind(index, subnet, aiter, index + 1), shares_environment=False)


if __name__ == "__main__":
    kinds.plan_host = plan_host  # kinds.plan_hosts looks the function up at each call
    sys.exit(labctl.main())
