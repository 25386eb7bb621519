"""Hosts that report the same thing, gathered: what a person reads of 1,000 nodes is the majority and the nodes
that differ from it, each group named once in Slurm's host list form (cdna2/reports/hostlist.py), never one line
per node."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

from cdna2.reports.hostlist import compress

Key = TypeVar("Key", bound=Hashable)
# A host list longer than this, of more than half of the hosts, is written as the hosts it leaves out ("all but
# nid[0007,0123]") where that is shorter: those are the ones that differ, named in the report anyway, and few when
# the cluster agrees.
NAMES_WIDTH = 40


def group_hosts(keyed: Iterable[tuple[str, Key]]) -> list[tuple[Key, list[str]]]:
    """Hosts with equal keys in one group each, hosts sorted: the majority first (a group of more than half of the
    hosts), then the others by their first host name."""
    by_key: dict[Key, list[str]] = {}
    for host, key in keyed:
        by_key.setdefault(key, []).append(host)
    groups = sorted(((key, sorted(hosts)) for key, hosts in by_key.items()), key=lambda group: group[1][0])
    total = sum(len(hosts) for _, hosts in groups)
    largest = max(groups, key=lambda group: len(group[1]), default=None)
    if largest is not None and len(largest[1]) * 2 > total:
        groups.remove(largest)
        groups.insert(0, largest)
    return groups


def hosts_label(hosts: list[str], everyone: Iterable[str]) -> str:
    """Hosts as a reader sees them among ``everyone``: ``mi210-a``, ``nid[001-004] (4)``; more than half of them,
    when their list is long, by the ones they leave out: ``all but nid[0007,0123] (998)``, ``all (1000)``."""
    names = compress(hosts)
    if len(hosts) == 1:
        return names
    everyone = set(everyone)
    if len(names) > NAMES_WIDTH and len(hosts) * 2 > len(everyone):
        rest = everyone.difference(hosts)
        names = min(names, f"all but {compress(rest)}" if rest else "all", key=len)
    return f"{names} ({len(hosts)})"


def counted(counts: dict[str, int]) -> str:
    """``{"ok": 995, "failed": 5}`` as ``995 ok, 5 failed``, the largest count first."""
    return ", ".join(f"{count} {name}" for name, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
