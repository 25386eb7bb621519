"""Kernel translation engine: AITER's gfx942 code objects re-encoded for gfx90a, proven, with pruned manifests."""

from cdna2.kernels.engine import TranslationError, classify_tree, translate_tree
from cdna2.kernels.policy import Policy
from cdna2.kernels.report import LIMITATIONS
from cdna2.kernels.tree_cache import TRANSLATOR_VERSION, cache_key
from cdna2.kernels.llvm import LlvmNotFoundError, LlvmTools, find_llvm

__all__ = ["LIMITATIONS", "TRANSLATOR_VERSION", "LlvmNotFoundError", "LlvmTools", "Policy", "TranslationError",
           "cache_key", "classify_tree", "find_llvm", "translate_tree"]
