"""The translation policy: which kernels are installed by their MFMA wait-state verdict, whether short MFMA edges are
padded and whether int8 K=32 MFMAs are split (host data), and its forms in the deployed record and on the command
line.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdna2.kernels import hazard_rules


@dataclass(frozen=True)
class Policy:
    """What the translator may do beyond re-encoding in place, and which kernels it installs (host data
    `kernel_hazard_policy`, `pad_mfma_hazards`, `int8_k32_split`)."""
    hazards: str = hazard_rules.DEFAULT_POLICY  # which audit verdicts are installed: hazard_rules.POLICIES
    # Pad every short MFMA edge the audit finds with exactly the missing wait states (s_nop before the consumer),
    # so the kernel is clean under LLVM's gfx90a rules; the policy then judges the padded kernel.
    pad_mfma_hazards: bool = True
    # Off until measured on an MI210: each split MFMA costs 4x the gfx942 cycles, so an unlocked kernel is not
    # necessarily faster than AITER's fallback.
    int8_k32_split: bool = False

    @property
    def label(self) -> str:
        """A name for the policy, for directories: `default`, `strict-unpadded-int8-k32-split`, ..."""
        return (self.hazards + ("" if self.pad_mfma_hazards else "-unpadded")
                + ("-int8-k32-split" if self.int8_k32_split else ""))

    @classmethod
    def of_host_data(cls, data) -> "Policy":
        """The policy a host's data selects (deploy and verify read the same keys)."""
        return cls(hazards=data.kernel_hazard_policy, pad_mfma_hazards=data.pad_mfma_hazards,
                   int8_k32_split=data.int8_k32_split)

    def record(self, audit_version: str | None = None) -> dict[str, str | bool]:
        """The whole policy as the deployed record keeps it (`kernel_hazards`), with the version of the MFMA
        wait-state audit that judged the tree (this tool's when None); verify compares it with the record a deploy
        would write now."""
        return {"policy": self.hazards, "audit_version": audit_version or hazard_rules.AUDIT_VERSION,
                "pad_mfma_hazards": self.pad_mfma_hazards, "int8_k32_split": self.int8_k32_split}

    @staticmethod
    def read_record(record: dict) -> dict[str, str | bool]:
        """A recorded `kernel_hazards` in the form record() gives, whichever deploy wrote it. Records without the
        pad and split fields were written by deploys that ran with padding on and the split off (the defaults
        since the re-assembler came; records from before it, when nothing was padded, read as padded too)."""
        return {"pad_mfma_hazards": True, "int8_k32_split": False, **record}

    @property
    def cli_arguments(self) -> list[str]:
        """The `python -m cdna2 translate` options that select this policy."""
        return (["--hazard-policy", self.hazards] + ([] if self.pad_mfma_hazards else ["--no-mfma-padding"])
                + (["--int8-k32-split"] if self.int8_k32_split else []))
