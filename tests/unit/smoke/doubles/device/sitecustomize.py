"""TEST DOUBLE of the GPU: CPU torch presented as one MI210, because no MI210 (and no ROCm torch) exists here.

Loaded by every interpreter of the smoke tests' target environment (this directory is on its path through a .pth
file, so ``python -I`` children load it too), active only when ``CDNA2_DEVICE_DOUBLE`` is set. Nothing is changed
until torch is imported; then:

- ``gfx90a``: torch reports a ROCm build (``torch.version.hip``) with one device, "AMD Instinct MI210 (device
  double: CPU)", gcnArchName ``gfx90a:sramecc+:xnack-``, 104 CUs. Tensors asked for on ``cuda`` live in CPU
  memory, ``synchronize`` returns at once, and large allocations (``empty``, ``empty_like``, ``full``) reuse freed
  blocks of the same size, as HIP's caching allocator does (the smoke test's NaN prefill relies on that);
- ``crash``: as ``gfx90a``, but asking for the device's properties kills the process with SIGSEGV (a broken HIP
  runtime or driver); ``hang``: asking for them never returns (a wedged driver);
- ``none``: a ROCm build that sees no GPU (``/dev/kfd`` not accessible, ``HIP_VISIBLE_DEVICES`` empty).

Device timing (the benchmarks): ``torch.cuda.Event(enable_timing=True)`` records the CPU time of the thread that
issues the calls (``time.thread_time``), and with ``synchronize`` returning at once the time between two events is
what the calls between them cost this process's thread: the device is this process's alone, so what other
processes take of a loaded machine does not count, as it would not on a GPU. torch runs on that one thread
(``set_num_threads(1)``): its worker threads would do work off that clock, and the waiting thread spin on it. ``torch.cuda._sleep(cycles)`` keeps
the "device" busy for that many cycles at 1 GHz (a busy loop on the same clock; real torch spins the GPU), and
``CDNA2_DEVICE_DOUBLE_SDPA_MS`` adds that many milliseconds of it to every ``scaled_dot_product_attention`` call
(the speed of the device's SDPA, the prefill benchmarks' fallback).

Not modelled: the device's own arithmetic (everything computes on the CPU), streams, real memory limits.
"""

import os
import signal
import sys
import time
import weakref
from importlib.abc import MetaPathFinder
from importlib.machinery import PathFinder
from types import SimpleNamespace

MODE = os.environ.get("CDNA2_DEVICE_DOUBLE")
POOLED_BYTES = 1 << 20  # HIP's caching allocator keeps blocks of 1 MiB and more in its large pool


class _CachingPool:
    """Freed device blocks by size, handed out again to the next allocation of that size."""

    def __init__(self):
        self.free = {}

    def give(self, torch, storage):
        # The dying tensor may still count (finalizers run as its Python object goes) and so does ``storage``: any
        # more is a view of it that still uses the memory.
        if torch._C._storage_Use_Count(storage._cdata) <= 2:
            self.free.setdefault(storage.nbytes(), []).append(storage)

    def take(self, nbytes):
        blocks = self.free.get(nbytes)
        return blocks.pop() if blocks else None


def _install(torch):
    from torch.overrides import TorchFunctionMode

    torch.version.hip = "6.4.43484-device-double"
    if MODE == "none":
        torch.cuda.is_available = lambda: False
        torch.cuda.device_count = lambda: 0
        return

    def properties(device=0):
        if MODE == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        while MODE == "hang":
            time.sleep(60)
        return SimpleNamespace(name="AMD Instinct MI210 (device double: CPU)", gcnArchName="gfx90a:sramecc+:xnack-",
                               multi_processor_count=104)

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_properties = properties
    torch.cuda.synchronize = lambda device=None: None

    class Event:
        """A device event on the issuing thread's CPU clock (every call here is synchronous)."""

        def __init__(self, enable_timing=False, blocking=False, interprocess=False):
            self.at = None

        def record(self, stream=None):
            self.at = time.thread_time()

        def synchronize(self):
            return None

        def elapsed_time(self, end):
            return (end.at - self.at) * 1000.0

    def busy(cycles):
        """The device busy for ``cycles`` at 1 GHz, on the events' clock."""
        until = time.thread_time() + cycles / 1e9
        while time.thread_time() < until:
            pass

    torch.set_num_threads(1)
    torch.cuda.Event = Event
    torch.cuda._sleep = busy
    sdpa_ms = float(os.environ.get("CDNA2_DEVICE_DOUBLE_SDPA_MS") or 0)
    if sdpa_ms:
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def slowed_sdpa(*args, **kwargs):
            busy(int(sdpa_ms * 1e6))
            return sdpa(*args, **kwargs)

        torch.nn.functional.scaled_dot_product_attention = slowed_sdpa
    pool = _CachingPool()
    allocators = {torch.empty, torch.empty_like, torch.full}

    def on_device(value):
        return value is not None and str(value).startswith("cuda")

    class DeviceIsHostMemory(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if on_device(kwargs.get("device")):
                kwargs["device"] = "cpu"
            if func in (torch.Tensor.cuda,) or (func is torch.Tensor.to and len(args) > 1 and on_device(args[1])):
                return args[0]
            tensor = func(*args, **kwargs)
            if func not in allocators or not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous():
                return tensor
            nbytes = tensor.untyped_storage().nbytes()
            if nbytes < POOLED_BYTES:
                return tensor
            reused = pool.take(nbytes)
            if reused is not None:
                tensor = torch.empty(0, dtype=tensor.dtype).set_(reused, 0, tensor.shape, tensor.stride())
                if func is torch.full:
                    tensor.fill_(args[1] if len(args) > 1 else kwargs["fill_value"])
            weakref.finalize(tensor, pool.give, torch, tensor.untyped_storage())
            return tensor

    DeviceIsHostMemory().__enter__()


class _AfterTorchImport(MetaPathFinder):
    """Finds torch as usual and installs the double once its module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = PathFinder.find_spec(name, path)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            _install(module)

        spec.loader.exec_module = exec_module
        return spec


if MODE:
    sys.meta_path.insert(0, _AfterTorchImport())
