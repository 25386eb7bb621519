"""Stage 3, judge: what each distinct gfx942 instruction is on gfx90a. Runs in the worker processes, a batch of
distinct instructions per task, queued as the scan finds them (so no core waits for a stage of its own).

For one batch, with three llvm-mc runs (and a fourth when the split is on):
- LLVM decodes each instruction for gfx942, and must consume exactly the bytes given (llvm.decode);
- each text gets its gfx90a spelling (isa.rename), used only where gfx942 itself encodes that spelling to the
  original bytes (the renamed texts are assembled for gfx942 too);
- each int8 K=32 MFMA gets its two gfx90a halves (split.py), planned by the split's rule;
- an instruction passes when its gfx90a spelling assembles to an encoding of the original length; a blocking one
  is named by its reason and bucket (isa.BUCKETS); a blocking int8 K=32 MFMA is splittable when the rule plans its
  halves and, with the split on, they assemble (in the same llvm-mc run as the rest) and decode back: the decoded
  text is what objdump prints for them, which the proof of a written split kernel needs. Without the split (a
  translation by default, classify) the rule alone says it, and no half is assembled (a quarter of the judge's
  gfx90a texts on the 0.1.7 tree): the halves keep the original's register classes, tuples and alignment, which
  gfx90a's K=16 forms take. Every planned pair assembles and decodes back on the 0.1.7 tree, v0.1.19 and
  v0.1.20.post1 (16,145, 18,145 and 18,177 pairs), and their reports without the split, translate's and classify's,
  were byte-identical before and after the rule took the place of the assembly.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdna2.kernels import isa, llvm, split
from cdna2.kernels.relocation_proof import Expected

_INT8_K32_PATTERN = dict(isa.BUCKETS)[isa.INT8_K32]


@dataclass
class Verdicts:
    """What judge_batch found, per instruction of the batch (indices into it)."""
    texts: list[str | None]  # the gfx942 text (None: LLVM does not decode these bytes as one instruction)
    gfx90a_texts: list[str | None]  # its gfx90a spelling
    encodings: dict[int, bytes]  # of each passing instruction: its gfx90a bytes
    reasons: dict[int, str]  # of each blocking instruction: why it blocks
    buckets: dict[int, str]  # of each blocking instruction
    splittable: list[int]  # the blocking int8 K=32 MFMAs whose split is planned (with it on: assembles, decodes)
    halves: dict[int, tuple[Expected, Expected]]  # of each splittable one, when decoded back
    assembled: int  # distinct texts assembled for gfx90a
    halves_assembled: int  # of them, halves of int8 K=32 MFMAs
    renamed: int  # distinct renamed texts assembled for gfx942


def judge_batch(tools: llvm.LlvmTools, chunks: list[bytes], with_split: bool) -> Verdicts:
    """The verdict on each of `chunks` (distinct instruction bytes) for gfx90a; `with_split`: the int8 K=32 split is on,
    so the halves are assembled and decoded back (their bytes and text are written and proven)."""
    texts = llvm.decode(tools, chunks, "gfx942")
    targets = [isa.rename(text) if text is not None else None for text in texts]
    # Every int8 K=32 MFMA blocks on gfx90a, where it does not exist: its split is planned before anything is
    # assembled, so that the halves go to llvm-mc in the same run as the rest.
    splits = {index: split.split_int8_k32(text) for index, text in enumerate(texts)
              if text is not None and _INT8_K32_PATTERN.search(text)}
    halves = {half for pair, _ in splits.values() if pair for half in pair} if with_split else set()
    gfx90a_texts = sorted({target for target in targets if target is not None} | halves)
    renamed = sorted({target for target, text in zip(targets, texts) if target != text})
    assembled = dict(zip(gfx90a_texts, llvm.assemble(tools, gfx90a_texts, "gfx90a")))
    aliases = dict(zip(renamed, llvm.assemble(tools, renamed, "gfx942")))
    verdicts = Verdicts(texts, targets, {}, {}, {}, [], {}, len(gfx90a_texts), len(halves), len(renamed))
    reasons = verdicts.reasons
    for index, (chunk, text, target) in enumerate(zip(chunks, texts, targets)):
        if text is None:
            reasons[index] = "LLVM does not decode these bytes as one gfx942 instruction"
            continue
        encoding, error = assembled[target]
        if encoding is None:
            reasons[index] = f"not valid gfx90a: {error}"
        elif len(encoding) != len(chunk):
            reasons[index] = f"gfx90a encoding is {len(encoding)} bytes, the original {len(chunk)}"
        elif target != text and aliases[target][0] != chunk:
            reasons[index] = f"{isa.mnemonic(target)} is not the same gfx942 instruction as {isa.mnemonic(text)}"
        else:
            verdicts.encodings[index] = encoding
    verdicts.buckets.update((index, isa.bucket_of(texts[index] or "")) for index in reasons)
    _judge_splits(tools, verdicts, splits, assembled, with_split)
    return verdicts


def _judge_splits(tools: llvm.LlvmTools, verdicts: Verdicts,
                  splits: dict[int, tuple[tuple[str, str] | None, str | None]],
                  assembled: dict[str, tuple[bytes | None, str | None]], with_split: bool) -> None:
    """Which blocking int8 K=32 MFMAs are splittable, and why the others are not (their reasons say it); without
    the split, those whose halves the rule plans (see the module's docstring)."""
    planned = {}
    for index, bucket in verdicts.buckets.items():
        if bucket == isa.INT8_K32:
            pair, why = splits[index]
            if pair is None:
                verdicts.reasons[index] += f"; {why}"
            else:
                planned[index] = pair
    if not with_split:
        verdicts.splittable += planned
        return
    texts = sorted({text for pair in planned.values() for text in pair})
    decodable = [assembled[t][0] for t in texts if assembled[t][0] is not None]
    printed = dict(zip(decodable, llvm.decode(tools, decodable, "gfx90a"))) if decodable else {}
    for index, pair in planned.items():
        encoded = [assembled[t][0] for t in pair]
        back = [printed.get(encoding) for encoding in encoded]
        if None in encoded:
            error = next(assembled[text][1] for text in pair if assembled[text][0] is None)
            verdicts.reasons[index] += f"; its split does not assemble for gfx90a: {error}"
        elif None in back:
            verdicts.reasons[index] += "; LLVM does not decode the halves of its split back as one instruction each"
        else:
            verdicts.splittable.append(index)
            verdicts.halves[index] = tuple(Expected(text, encoding) for encoding, text in zip(encoded, back))
