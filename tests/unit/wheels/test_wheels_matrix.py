"""The wheel matrix loads only when it is valid, and says where it is not."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cdna2.wheels import MatrixError, load_matrix

PYPI = "https://pypi.org/simple"


def entry(**changes) -> dict:
    base = {"version": "6.4", "python": ["3.11"],
            "amd_aiter": {"version": "0.1.7.post2.dev18", "index_url": PYPI},
            "triton": {"version": "3.7.1", "index_url": PYPI, "no_deps": True}}
    return base | changes


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_packaged_matrix_loads_with_real_indexes():
    matrix = load_matrix()
    assert {"6.3", "6.4", "7.0", "7.1", "7.14"} <= set(matrix.rocm_versions())
    torch = matrix.entry_for("6.4.3").package("torch")
    assert torch.index_url == "https://download.pytorch.org/whl/rocm6.4" and torch.version.endswith("+rocm6.4")
    assert all(entry.package("triton").version == "3.7.1" for entry in matrix.entries)


@pytest.mark.parametrize(("document", "where", "reason"), [
    ({"$schema": "wheel-matrix-1.0.json", "rocm": [entry(torhc={"version": "1", "index_url": PYPI})]},
     "$.rocm[0]", "Additional properties"),
    ({"$schema": "wheel-matrix-1.0.json", "rocm": [entry(triton={"version": "3.7.0", "index_url": PYPI})]},
     "$.rocm[0].triton.version", "should not be valid"),
    ({"$schema": "wheel-matrix-1.0.json", "rocm": [entry(version="six")]}, "$.rocm[0].version", "does not match"),
    ({"$schema": "wheel-matrix-1.0.json",
      "rocm": [entry(amd_aiter={"version": "0.1.7", "index_url": "pypi.org/simple"})]},
     "$.rocm[0].amd_aiter.index_url", "does not match"),
    ({"$schema": "wheel-matrix-2.0.json", "rocm": [entry()]}, "$.$schema", "does not match"),
    ({"$schema": "wheel-matrix-1.0.json", "rocm": []}, "$.rocm", "should be non-empty"),
])
def test_schema_violations_name_file_path_and_reason(tmp_path, document, where, reason):
    path = write(tmp_path, document)
    with pytest.raises(MatrixError) as raised:
        load_matrix(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: {where}:") and reason in message, message


def test_duplicate_rocm_versions_are_refused(tmp_path):
    path = write(tmp_path, {"$schema": "wheel-matrix-1.0.json", "rocm": [entry(), entry()]})
    with pytest.raises(MatrixError, match=r"\$\.rocm\[1\]\.version: ROCm 6\.4 is already listed at \$\.rocm\[0\]"):
        load_matrix(path)


def test_unreadable_and_invalid_yaml_name_the_file(tmp_path):
    with pytest.raises(MatrixError, match="cannot read"):
        load_matrix(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("rocm: [\n")
    with pytest.raises(MatrixError, match=f"{broken}: not valid YAML"):
        load_matrix(broken)
