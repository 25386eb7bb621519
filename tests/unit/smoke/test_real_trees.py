"""The static checks against the real amd-aiter 0.1.7.post2.dev18 and vLLM 0.23.0 trees from the lab wheelhouse."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from cdna2.host import smoke_static
from lab import wheelhouse


def test_real_trees_match_their_record_and_aiter_hsa_root_is_found(tmp_path: Path) -> None:
    aiter, vllm = wheelhouse.installed_tree(wheelhouse.AITER), wheelhouse.installed_tree("vllm==0.23.0")
    with smoke_static.searched_first(aiter), smoke_static.searched_first(vllm):
        view = smoke_static.read_host(aiter, tmp_path / "state")
        check = smoke_static.check_record(view)
    assert view.aiter["hsa_root"] == str(aiter / "aiter_meta" / "hsa")
    assert check["status"] == "passed", check["detail"]
    counts = re.match(r"(\d+) amd-aiter and (\d+) vllm files match RECORD", check["detail"])
    assert counts and int(counts.group(1)) > 1000 and int(counts.group(2)) > 1000, check["detail"]


def test_real_gfx942_code_objects_read_as_gfx942() -> None:
    pa = wheelhouse.installed_tree(wheelhouse.AITER) / "aiter_meta" / "hsa" / "gfx942" / "pa"
    machines = Counter(smoke_static.machine_of(path) for path in pa.glob("*.co"))
    assert set(machines) == {"gfx942"} and machines["gfx942"] > 10, machines
