"""Two controllers (two deploys, two test sessions) needing the translation of one gfx942 tree at the same moment
on one cold cache: the tree is fetched once and translated once, the second waits and takes the first one's."""

from __future__ import annotations

import json
import tarfile
import time
from dataclasses import asdict
from pathlib import Path

from cdna2.host.digests import tree_digest
from cdna2.kernels import Policy
from cdna2.translated import ensure_source, ensure_translation
from tests.unit.racing import append_line, race

FETCH_SECONDS = 0.3


def _slow_fetch(source: Path, calls: Path, archive: Path) -> None:
    """What the deploy's fetch from a host does (a tar of hsa/gfx942 downloaded), slowed so the racers overlap."""
    append_line(calls, "fetch")
    time.sleep(FETCH_SECONDS)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="gfx942")


def _translate_on_a_cold_cache(source: str, cache: str, log: str, results: str, barrier) -> None:
    digest = tree_digest(source)
    barrier.wait()
    fetched = ensure_source(Path(cache), digest, lambda archive: _slow_fetch(Path(source), Path(log), archive))
    tree = ensure_translation(Path(cache), digest, fetched, Policy(),
                              progress=lambda line: append_line(Path(log), line.split(" ", 1)[0]))
    append_line(Path(results), json.dumps(asdict(tree), default=str, sort_keys=True))


def test_two_controllers_fetch_and_translate_one_tree_once(build_code_object, tmp_path):
    source, cache, log, results = tmp_path / "gfx942", tmp_path / "cache", tmp_path / "log", tmp_path / "results"
    build_code_object(source / "plain.co", "v_mov_b32_e32 v0, v1")
    race(_translate_on_a_cold_cache, str(source), str(cache), str(log), str(results))
    # "translating ..." from the process that did it, "translated ... taken from the controller cache" from the other
    assert sorted(log.read_text().splitlines()) == ["fetch", "translated", "translating"]
    first, second = (json.loads(line) for line in results.read_text().splitlines())
    assert first == second and first["kernels"] == 1 and Path(first["archive"]).is_file()
    assert not list((cache / "sources").glob(".*")), "no fetch staging left behind"
