"""The shipped patch-set data and the catalog's validation."""

from __future__ import annotations

import shutil

import pytest
import yaml

from cdna2.patches import PatchDataError, load_catalog
from cdna2.patches.catalog import DEFAULT_PATCHSET_DIR

OPTIONAL = ["aiter-ck-int8-gemm", "aiter-skip-fp8-tune-instances", "aiter-triton-gfx90a", "vllm-aiter-triton-ops",
            "vllm-ck-int8-gemm", "vllm-fast-fp8-dequant", "vllm-prefer-aiter-fa"]


def test_shipped_catalog_names_and_roles(catalog):
    assert sorted(catalog.optional_sets()) == OPTIONAL
    assert sorted(set(catalog.set_names()) - set(OPTIONAL)) == ["aiter-asm-paths", "vllm-attention-gate"]
    assert catalog.by_name("vllm-ck-int8-gemm").requires == ("vllm-attention-gate",)
    assert "vllm/_aiter_ops.py" in catalog.target_files("vllm")
    assert "aiter_meta/csrc/cpp_itfs/mha_fwd.cu" in catalog.target_files("amd-aiter")


def _copy_data(tmp_path):
    directory = tmp_path / "patchsets"
    shutil.copytree(DEFAULT_PATCHSET_DIR, directory)
    return directory


def _edit(path, change):
    document = yaml.safe_load(path.read_text())
    change(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.mark.parametrize("change, json_path, reason", [
    (lambda d: d.update(colour="red"), "$", "Additional properties are not allowed"),
    (lambda d: d["variants"][0]["sites"][1].update(count="one"), "$.variants[0].sites[1].count", "is not of type"),
    (lambda d: d["variants"][0]["sites"][0].pop("marker"), "$.variants[0].sites[0]", "'marker' is a required"),
    (lambda d: d.update(role="maybe"), "$.role", "is not one of"),
])
def test_schema_violation_names_file_path_and_reason(tmp_path, change, json_path, reason):
    directory = _copy_data(tmp_path)
    _edit(directory / "vllm-attention-gate.yaml", change)
    with pytest.raises(PatchDataError) as raised:
        load_catalog(directory)
    message = str(raised.value)
    assert message.startswith(f"{directory / 'vllm-attention-gate.yaml'}: {json_path}: "), message
    assert reason in message


def test_dependency_on_unknown_set_is_rejected(tmp_path):
    directory = _copy_data(tmp_path)
    _edit(directory / "vllm-ck-int8-gemm.yaml", lambda d: d.update(requires=["vllm-no-such-set"]))
    with pytest.raises(PatchDataError, match=r"vllm-ck-int8-gemm.yaml: \$.requires\[0\]: no set named 'vllm-no-such-set'"):
        load_catalog(directory)


def test_an_earlier_replacement_inside_the_current_one_is_rejected(tmp_path):
    """An earlier release's text found inside today's replacement would make every patched file read as the earlier
    release's, rewritten on every deploy."""
    directory = _copy_data(tmp_path)

    def earlier_inside(document):
        site = document["variants"][0]["sites"][0]
        site["earlier_replacements"] = [site["replacement"]]

    _edit(directory / "vllm-prefer-aiter-fa.yaml", earlier_inside)
    with pytest.raises(PatchDataError, match=r"\$.variants\[0\].sites\[0\].earlier_replacements\[0\]: occurs in the "
                                             r"replacement or the anchor"):
        load_catalog(directory)


def test_marker_must_be_inside_the_replacement(tmp_path):
    directory = _copy_data(tmp_path)
    _edit(directory / "vllm-prefer-aiter-fa.yaml",
          lambda d: d["variants"][0]["sites"][0].update(marker="not-in-the-text"))
    with pytest.raises(PatchDataError, match=r"\$.variants\[0\].sites\[0\].marker: 'not-in-the-text' does not occur"):
        load_catalog(directory)
