"""AITER's 2-D convolutions (``aiter/ops/triton/conv/``, v0.1.18 on): how ``conv/_launch.py`` launches each kernel
from one config of a ``conv/{arch}-CONV-*.json`` file (``utils/conv_config_utils.get_conv_config``: an exact shape,
else an ``M_LEQ_`` bucket, else ``any``).

Read from v0.1.20.post1's ``conv/conv2d.py`` (routes), ``conv/_launch.py`` (launches), ``conv/_prepack.py`` and
``conv/_utils.py`` (paddings), and diffed against v0.1.18, v0.1.19 and v0.1.19.post2 (``git diff``): the kernels'
arguments, constexprs and config keys are the same on all four (v0.1.18 and v0.1.19 differ from v0.1.19.post2 in
import order and annotations only; v0.1.20 adds RDNA3 entries to the autotune lists and reads the file through
``utils/core.load_config_json``), and so are gfx942's seven conv files, so one recipe serves them. Inputs are bf16
or fp16 only; the bias is cast to fp32; channels (and the flattened C*R*S of the general kernel) are padded to 64,
the channel block of the blocked layout is 64; Winograd F(4,3) tiles the output 4x4 (T = N * ceil(P/4) * ceil(Q/4)
tiles), its transformed input is bf16 and its GEMM output fp32. Every kernel takes the image sizes as constexprs, so
the proof compiles one ResNet-like layer: 256 channels in and out, 56x56, batch 1 (the first wins of the Winograd
route need C, K >= 512: its kernels are compiled at 512).
"""

from __future__ import annotations

from cdna2.triton.recipes.sizes import Path

KERNELS = "aiter.ops.triton._triton_kernels.conv"
CHANNELS, SIDE, PADDED = 256, 56, 64  # C = K_out; H = W = P = Q (stride 1, "same" padding); conv/_utils.BLOCK_K
WINOGRAD_CHANNELS = 512
TILE_SIDE = (SIDE + 3) // 4  # _launch_winograd_f4x3: tile_H = (P + 3) // 4; T = N * tile_H * tile_W, N = 1
# The epilogues: each kernel has relu, relu6 and gelu branches, and the bias is optional; two paths cover both.
EPILOGUES = (("bias, relu", True, "relu"), ("no bias, gelu", False, "gelu"))


def _request(config: dict, module: str, kernel: str, values: dict, tensors: dict) -> dict:
    return {"modules": [f"{KERNELS}.{module}"], "kernel": kernel, "values": {**config, **values},
            "tensor_dtype": "bf16", "tensors": tensors}


def _image(channels: int = CHANNELS) -> dict:
    return {"C": channels, "H": SIDE, "W_in": SIDE, "K_out": channels, "P": SIDE, "Q": SIDE,
            "C_pad": -(-channels // PADDED) * PADDED, "stride_h": 1, "stride_w": 1, "dil_h": 1, "dil_w": 1}


DIRECT = {"X": "bf16", "W": "bf16", "BIAS": "fp32", "Y": "bf16"}


def _direct(config: dict, module: str, kernel: str, extra: dict) -> list[Path]:
    return [(name, _request(config, module, kernel, {**_image(), "HAS_BIAS": bias, "ACTIVATION": activation,
                                                     **extra(index)}, DIRECT))
            for index, (name, bias, activation) in enumerate(EPILOGUES)]


def conv_1x1(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    """_launch_1x1: NCHW and NHWC (conv2d's ``layout``), one epilogue each."""
    return _direct(config, "conv_1x1", "_conv2d_1x1_kernel",
                   lambda index: {"LAYOUT": ("nchw", "nhwc")[index], "pad_h": 0, "pad_w": 0})


def conv_3x3_nhwc(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    return _direct(config, "conv_3x3", "_conv2d_3x3_nhwc_kernel", lambda index: {"pad_h": 1, "pad_w": 1})


def conv_3x3_cblocked(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    return _direct(config, "conv_3x3", "_conv2d_3x3_cblocked_kernel",
                   lambda index: {"Cb": PADDED, "pad_h": 1, "pad_w": 1})


def conv_general(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    """_launch_general: any R x S (here 5x5, "same" padding), NCHW and NHWC; K_pad = C*R*S padded to 64."""
    return _direct(config, "conv_general", "_conv2d_general_kernel",
                   lambda index: {"R": 5, "S": 5, "K_pad": -(-CHANNELS * 25 // PADDED) * PADDED, "pad_h": 2,
                                  "pad_w": 2, "LAYOUT": ("nchw", "nhwc")[index]})


def _winograd(channels: int = WINOGRAD_CHANNELS) -> dict:
    return {"N": 1, "C": channels, "C_pad": channels, "K_out": channels, "H": SIDE, "W_in": SIDE, "P": SIDE,
            "Q": SIDE, "tile_H": TILE_SIDE, "tile_W": TILE_SIDE, "T": TILE_SIDE ** 2, "pad_h": 1, "pad_w": 1,
            "Cb": PADDED}


def conv_winograd_gemm(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    """The batched GEMM of the 36 transformed tiles: V (bf16) x U (bf16) -> M (fp32)."""
    return [("batched GEMM", _request(config, "conv_3x3_winograd_f4x3", "_winograd_f4x3_batched_gemm_kernel",
                                      _winograd(), {"V": "bf16", "U": "bf16", "M_out": "fp32"}))]


def conv_winograd_input(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    """The input transform: NCHW and NHWC (route WF4X3), and the channel-blocked one (route WF4X3_CBLOCKED)."""
    tensors = {"X": "bf16", "V": "bf16"}
    return [(f"{layout} input", _request(config, "conv_3x3_winograd_f4x3", "_winograd_f4x3_input_transform_kernel",
                                         {**_winograd(), "LAYOUT": layout}, tensors)) for layout in ("nchw", "nhwc")
            ] + [("channel-blocked input", _request(config, "conv_3x3_winograd_f4x3",
                                                    "_winograd_f4x3_cblocked_input_transform_kernel", _winograd(),
                                                    tensors))]


def conv_winograd_output(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    tensors = {"M_in": "fp32", "BIAS": "fp32", "Y": "bf16"}
    return [(f"{layout}, {name}", _request(config, "conv_3x3_winograd_f4x3", "_winograd_f4x3_output_transform_kernel",
                                           {**_winograd(), "HAS_BIAS": bias, "ACTIVATION": activation,
                                            "LAYOUT": layout}, tensors))
            for layout, (name, bias, activation) in zip(("nchw", "nhwc"), EPILOGUES)]
