"""Where and how computations run: the device, the autocast dtype, the CPU threads, seeding, the cache folder
and the compiler's settings.

Every command and library function that needs one of these takes it from here, so that the
analysis tools and commands take them from one place.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

from txl.config.fields import DTYPES, MAX_THREADS, check_choice, check_threads
from txl.errors import TxlError, quoted


def resolve_device(name: str) -> torch.device:
    """``"auto"`` → cuda when available, else cpu; otherwise the named device: ``cpu``, ``cuda`` or
    ``cuda:N`` (the devices txl runs on).

    Raises:
        TxlError: any other name (``mps``, ``cpu:0``, ...), or a CUDA device this machine does not have.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", str(name)):
        raise TxlError(f"unknown device {quoted(name)}; use auto, cpu, cuda or cuda:N")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TxlError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise TxlError(f"device {name!r} requested but this machine has {count} CUDA device(s); use cuda:0"
                       + (f" to cuda:{count - 1}" if count > 1 else ""))
    return device


def autocast(device: torch.device, dtype: str):
    """Autocast context for ``"bfloat16"``/``"float16"`` on ``device``; a no-op for ``"float32"``.
    ``dtype`` may also be the torch dtype itself (``torch.bfloat16``).

    Raises:
        TxlError: a dtype other than those in :data:`DTYPES`.
    """
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    check_choice(dtype, DTYPES, "dtype")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


# CPU feature flags (Linux /proc/cpuinfo) that mean native arithmetic in a half-precision type: x86
# AVX512-BF16/AMX-BF16 and AVX512-FP16/AMX-FP16, Arm BF16 and half-precision SIMD; and int8 dot products
# with int32 sums (x86 VNNI or AMX-INT8, Arm dot product / i8mm), which int8 weights' products need to be fast
_NATIVE_CPU_FLAGS = {"bfloat16": {"avx512_bf16", "amx_bf16", "bf16"},
                     "float16": {"avx512fp16", "avx512_fp16", "amx_fp16", "asimdhp", "fphp"},
                     "int8": {"avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"}}


def cpu_flags() -> set[str] | None:
    """The feature flags of this CPU from ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``); None where
    the system does not say (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def native_dtype_support(device: torch.device, dtype: str) -> bool:
    """Whether ``device`` computes in ``dtype`` natively rather than emulating it (many times slower).

    float32 and CUDA devices are taken as native. On a CPU, bfloat16 needs AVX512-BF16 or AMX (x86)
    or the BF16 extension (Arm), float16 AVX512-FP16/AMX-FP16 or Arm half-precision SIMD, "int8" (int8
    products with int32 sums) VNNI or AMX-INT8 (x86) or the dot-product extension (Arm), as listed by
    :func:`cpu_flags`; where the flags cannot be read, True (no false alarm).
    """
    if dtype == "float32" or device.type != "cpu" or dtype not in _NATIVE_CPU_FLAGS:
        return True
    flags = cpu_flags()
    if flags is None:
        return True
    return bool(flags & _NATIVE_CPU_FLAGS[dtype])


def usable_cpus(cgroup: str | Path = "/sys/fs/cgroup") -> int:
    """The CPUs this process may run on: its affinity mask (``os.sched_getaffinity``; ``os.cpu_count()``
    where the system has none), capped by a container's CPU quota read under ``cgroup`` (v2
    ``cpu.max``, v1 ``cpu/cpu.cfs_quota_us`` over ``cpu/cpu.cfs_period_us``), rounded up; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    root = Path(cgroup)
    for quota_file, period_file in ((root / "cpu.max", None),
                                    (root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us")):
        try:
            fields = quota_file.read_text(encoding="ascii").split()
            if period_file is not None:
                fields.append(period_file.read_text(encoding="ascii").strip())
            if fields[0] not in ("max", "-1") and int(fields[1]) > 0:
                cpus = min(cpus, -(-int(fields[0]) // int(fields[1])))
        except (OSError, ValueError, IndexError):
            pass
    return max(1, cpus)


def load_average() -> float | None:
    """The 1-minute load average of the machine (runnable processes, ``os.getloadavg``), or None where
    the system does not say."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_now(samples: int = 5, interval: float = 0.01) -> float | None:
    """How many threads of other processes are runnable right now: the mean over ``samples`` reads of
    ``/proc/loadavg`` (``interval`` seconds apart) of its runnable count less this process's own
    running thread; None where the system does not say (not Linux).

    The load average lags by about a minute (a command started just after ``pip install`` would
    still see it busy); this count does not, but it is noisy, so :func:`choose_threads` takes the
    smaller of the two."""
    counts = []
    for k in range(samples):
        try:
            counts.append(max(0, int(Path("/proc/loadavg").read_text(encoding="ascii").split()[3].split("/")[0]) - 1))
        except (OSError, ValueError, IndexError):
            return None
        if k + 1 < samples:
            time.sleep(interval)
    return sum(counts) / len(counts)


def _env_threads(env: str | None) -> int | None:
    """``OMP_NUM_THREADS`` as a thread count, None when unset or not an integer in ``[1, MAX_THREADS]``."""
    if env is not None and env.strip().isdigit() and 0 < int(env) <= MAX_THREADS:
        return int(env)
    return None


def choose_threads(requested: int | None, *, cpus: int, load: float | None, online: int | None = None,
                   env: str | None = None, now: float | None = None, flag: str = "--threads") -> tuple[int, str]:
    """How many intra-op threads torch should use, and why, as ``(threads, text)``; touches nothing.

    On a machine shared with busy processes, torch's default (one thread per CPU) makes its threads
    wait on each other: a step takes many times longer than with fewer threads. The rule:
    ``requested`` >= 1 is taken as given; else a positive integer ``env`` (``OMP_NUM_THREADS``) is;
    else (None or 0: automatic) the CPUs this process may use minus the busy ones, at least 1. The
    busy ones are the 1-minute load average ``load``, or the threads of other processes runnable
    ``now`` (:func:`busy_now`) when fewer, scaled to this process's share of the machine when it may
    use only ``cpus`` of ``online`` CPUs (both count the whole machine), rounded to the nearest whole
    CPU. ``text`` says it for the start line of a command: ``"threads 1 (2 CPUs, load 1.3)"``, with
    ``", busy now 1.0"`` after the load when ``now`` is known.

    Raises:
        TxlError: ``requested`` that is not an integer in ``[0, MAX_THREADS]`` (``flag`` names it).
    """
    check_threads(requested, flag)
    seen = f"{cpus} CPU{'s' if cpus != 1 else ''}, load " + ("unknown" if load is None else f"{load:.1f}")
    seen += "" if now is None else f", busy now {now:.1f}"
    if requested:
        return requested, f"threads {requested} ({flag}; {seen})"
    if _env_threads(env) is not None:
        return _env_threads(env), f"threads {_env_threads(env)} (OMP_NUM_THREADS; {seen})"
    busy = min(max(0.0, value) for value in (load, now, float("inf")) if value is not None)
    busy = 0.0 if busy == float("inf") else busy
    if online and online > cpus:
        busy *= cpus / online
    threads = max(1, min(cpus, math.floor(cpus - busy + 0.5)))
    return threads, f"threads {threads} ({seen})"


def pick_threads(requested: int | None = None, flag: str = "--threads", keep: int | None = None) -> tuple[int, str]:
    """The thread count :func:`choose_threads` gives for this machine now (its CPUs, load, the threads busy
    now when the choice is automatic, and ``OMP_NUM_THREADS``), and the text for a command's start line
    (``"threads 1 (2 CPUs, load 1.3, busy now 1.0)"``); sets nothing (for a runtime other than torch's,
    e.g. ONNX Runtime's intra-op threads).

    ``keep`` (a count recorded earlier, e.g. by the run being resumed) replaces the automatic choice:
    another thread count changes float results in their last digits, so a resumed run keeps its own.

    Raises:
        TxlError: as :func:`choose_threads`.
    """
    env = os.environ.get("OMP_NUM_THREADS")
    automatic = not requested and _env_threads(env) is None
    if automatic and keep:
        requested, flag = keep, "as recorded by the run"
    return choose_threads(requested, cpus=usable_cpus(), load=load_average(), online=os.cpu_count(),
                          env=env, now=busy_now() if automatic and not keep else None, flag=flag)


def set_threads(requested: int | None = None, flag: str = "--threads", keep: int | None = None) -> str:
    """Set torch's intra-op threads by :func:`pick_threads`; returns the text for the command's start line
    (``"threads 1 (2 CPUs, load 1.3, busy now 1.0)"``).

    Raises:
        TxlError: as :func:`choose_threads`.
    """
    threads, text = pick_threads(requested, flag, keep)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return text


# inductor's settings for every model txl compiles. "inplace_buffers" lets a kernel write its output into
# an input's buffer once nothing reads that input again; on torch 2.13's CPU backend it got a model of 4 or
# more layers wrong when the graph reads a segment after a memory and returns the logits and the next
# memory (the prompt reader of `txl generate --compile`): logits off by 0.7-25, greedy text garbled from
# the first token (3 layers and fewer, training, and `txl eval --compile`'s graph were right). With it off,
# the compiled model equals eager to float rounding (tests/model/test_compile.py).
INDUCTOR_OPTIONS = {"inplace_buffers": False}


def compile_module(module, *, backend: str | None = None, **kwargs):
    """``torch.compile(module, **kwargs)`` with :data:`INDUCTOR_OPTIONS` when the backend is inductor (the
    default, ``backend`` None or "inductor"); another backend (e.g. "aot_eager") takes no options.

    Inductor's ``mode`` presets (e.g. "max-autotune") are not taken: ``torch.compile`` refuses a mode
    together with options; give the preset's settings as ``options`` instead.

    Returns the compiled module (or function). Raises what ``torch.compile`` raises (a failed compilation
    shows when the module is first called); TypeError for ``mode``."""
    if "mode" in kwargs:
        raise TypeError("compile_module takes no mode (torch.compile refuses it with options); pass options")
    if backend not in (None, "inductor"):
        return torch.compile(module, backend=backend, **kwargs)
    options = {**INDUCTOR_OPTIONS, **kwargs.pop("options", {})}
    if backend is None:  # (torch.compile's own default, whatever a caller has bound it to)
        return torch.compile(module, options=options, **kwargs)
    return torch.compile(module, backend=backend, options=options, **kwargs)


PROGRESS_EVERY_S = 30.0
"""Seconds between two progress lines when stderr is not a terminal (a log file, a pipe)."""


class _ProgressLines:
    """Where a progress bar writes when stderr is not a terminal: each refresh becomes one line (no
    carriage returns piling up in a log), and the blanks that clear a finished bar are left out."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").rstrip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(total: int, progress: bool | str, label: str, unit: str = "segment", **options):
    """A tqdm bar on stderr for ``total`` steps of ``unit`` (segments, windows, examples, steps, bytes),
    or a disabled one (same interface, prints nothing) when ``progress`` is False. A string ``progress``
    replaces ``label`` (``"mem_len 256"``); ``options`` go to tqdm (``initial``, ``leave``,
    ``unit_scale``). On a terminal the bar redraws in place and is cleared when closed (unless
    ``leave=True``), so the result line that follows stands alone; elsewhere (a log file, a pipe) it
    writes one line at most every :data:`PROGRESS_EVERY_S` seconds, so a long run's log stays small."""
    from tqdm import tqdm

    where = {"dynamic_ncols": True, "file": sys.stderr} if sys.stderr.isatty() else {
        "file": _ProgressLines(sys.stderr), "mininterval": PROGRESS_EVERY_S, "maxinterval": PROGRESS_EVERY_S,
        "ncols": 100}
    return tqdm(total=total, desc=progress if isinstance(progress, str) else label, unit=unit,
                disable=not progress, **{"leave": False, **where, **options})


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's (all devices) random number generators with ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def reads_values(t: torch.Tensor) -> bool:
    """Whether txl reads ``t``'s values on the host here, for a check or a decision: only for CPU tensors
    and not while ``torch.compile`` traces (a read would break the graph). A CPU tensor's values are
    there already; on an accelerator the read would wait for all the work queued before it (a host
    synchronisation), so per-token and per-segment loops skip such checks or keep their result on the
    device until the loop ends. Every value check in txl asks this one function."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def memory_bytes() -> int:
    """This machine's physical memory in bytes (a very large number where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def available_memory_bytes(device=None) -> int:
    """Memory available to new allocations of this process in bytes, on ``device``.

    On a CUDA device (a ``torch.device``, a name such as ``"cuda:1"`` or an index), that device's free
    memory (``torch.cuda.mem_get_info``) plus what torch's caching allocator holds unused there: buffers
    placed there are limited by it, not by the host's RAM.
    Otherwise (None, the CPU, other devices whose memory is the host's) the least of ``MemAvailable``
    (/proc/meminfo), the room left under a cgroup memory limit (a container's; v2 or v1) and under an
    address-space limit (``ulimit -v``), where each exists; the physical memory (:func:`memory_bytes`)
    where none does."""
    if device is not None and not isinstance(device, str) and getattr(device, "type", None) is None:
        device = f"cuda:{int(device)}"  # an index names a CUDA device, as torch does
    if device is not None and str(getattr(device, "type", device)).split(":")[0] == "cuda":
        import torch

        free = int(torch.cuda.mem_get_info(device)[0])  # the driver's free memory, plus what torch's
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # cache holds unused
        return free + max(0, int(cached))
    figures = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            figures += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            cap = Path(limit).read_text(encoding="ascii").strip()
            if cap != "max" and int(cap) < 1 << 60:
                figures.append(max(0, int(cap) - int(Path(usage).read_text(encoding="ascii"))))
        except (OSError, ValueError):
            pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            pages = int(Path("/proc/self/statm").read_text(encoding="ascii").split()[0])
            figures.append(max(0, soft - pages * os.sysconf("SC_PAGE_SIZE")))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(figures) if figures else memory_bytes()


def resident_bytes(pid: int | None = None, field: str = "VmRSS") -> int | None:
    """The resident memory of process ``pid`` (None: this one) in bytes, from /proc/PID/status:
    ``field`` "VmRSS" (now) or "VmHWM" (its peak since the process image started); None where the
    system does not say (not Linux, or no such process)."""
    try:
        with open(f"/proc/{pid or 'self'}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation failure: MemoryError, torch's out-of-memory errors, or the CPU
    allocator's RuntimeError ("can't allocate memory")."""
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(err, RuntimeError) and ("can't allocate memory" in str(err) or "out of memory" in str(err))


def check_fits(need: int, what: str, advice: str, device=None) -> None:
    """Refuse ``need`` bytes for ``what`` that the available memory of ``device`` cannot hold
    (:func:`available_memory_bytes`): one clear line instead of an allocator's traceback or the
    process being killed.

    Raises:
        TxlError: naming ``what``, the bytes needed and available, and ``advice`` (what to make smaller).
    """
    have = available_memory_bytes(device)
    if need > have:
        from txl.errors import TxlError

        raise TxlError(f"{what} needs {format_bytes(need)}, more than the {format_bytes(have)} of memory "
                       f"available: {advice}")


def format_bytes(n: int) -> str:
    """A byte count for people, one decimal: GiB from 1 GiB on, MiB from 1 MiB on, else KiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/txl`` or ``~/.cache/txl``: where encoded corpora are cached."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "txl")
