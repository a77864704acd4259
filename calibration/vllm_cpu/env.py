"""Environment variables a process running the CPU build of vLLM needs.

vLLM's CPU backend wants tcmalloc and Intel's OpenMP runtime (``libiomp5.so``, shipped in the venv by
the ``intel-openmp`` wheel) preloaded; it binds its OpenMP threads to NUMA node 0 and by default
reserves one core for the front end, which leaves a single compute thread on a 2-core machine.
``LD_PRELOAD`` only takes effect when a process starts, so apply these to a child process's
environment (``subprocess.run(..., env=cpu_engine_env())``) or re-exec the current one
(:func:`reexec_with_cpu_env`).
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

TCMALLOC_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
    "/usr/lib/libtcmalloc_minimal.so.4",
)

_REEXEC_MARK = "SPECADVISOR_CPU_ENV_APPLIED"


def find_tcmalloc() -> str | None:
    """Path of a tcmalloc shared library (Debian ``libtcmalloc-minimal4``), or None."""
    for path in TCMALLOC_CANDIDATES:
        if os.path.exists(path):
            return path
    for pattern in ("/usr/lib/*/libtcmalloc_minimal.so*", "/usr/lib*/libtcmalloc_minimal.so*"):
        hits = sorted(p for p in glob.glob(pattern) if "debug" not in p)
        if hits:
            return hits[0]
    return None


def find_iomp(prefix: str | None = None) -> str | None:
    """Path of ``libiomp5.so`` in the running interpreter's environment (``<prefix>/lib``), or None."""
    for base in filter(None, (prefix, sys.prefix, sys.base_prefix)):
        path = Path(base) / "lib" / "libiomp5.so"
        if path.exists():
            return str(path)
    return None


def cpu_engine_env(
    kv_cache_space_gib: int | None = 4,
    num_reserved_cpu: int = 0,
    base: dict[str, str] | None = None,
    preload: bool = True,
) -> dict[str, str]:
    """The environment for a process that starts a vLLM CPU engine.

    Returns ``base`` (default: ``os.environ``) updated with:
    - ``VLLM_CPU_NUM_OF_RESERVED_CPU`` (default 0: the engine uses every core),
    - ``VLLM_CPU_KVCACHE_SPACE`` in GiB (None: leave it to ``gpu_memory_utilization``),
    - ``LD_PRELOAD`` prefixed with tcmalloc and the venv's ``libiomp5.so`` where they exist,
    - ``TOKENIZERS_PARALLELISM=false``, ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` and ``NUMBA_NUM_THREADS=<cores>``
      unless set.
    """
    env = dict(os.environ if base is None else base)
    env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(num_reserved_cpu)
    if kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_space_gib))
    if preload:
        libs = [p for p in (find_tcmalloc(), find_iomp()) if p]
        existing = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
        if any("libiomp" in p for p in libs):  # one OpenMP runtime: vLLM's CPU executor asserts not both, and an
            existing = [p for p in existing if "libgomp" not in p]  # imported vLLM may have put libgomp there
        env["LD_PRELOAD"] = ":".join(dict.fromkeys(libs + existing))
        if not env["LD_PRELOAD"]:
            del env["LD_PRELOAD"]
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    # vllm-cpu 0.32: numba defaults to 1 thread in the pinned worker, and the n-gram proposer's thread reset
    # then drops torch's shared OpenMP pool to 1 core (an idle n-gram engine ran 30 vs 23.5 ms per step).
    env.setdefault("NUMBA_NUM_THREADS", str(os.cpu_count() or 1))
    return env


def missing_preloads() -> list[str]:
    """Names of the recommended preload libraries that are not found on this machine."""
    missing = []
    if find_tcmalloc() is None:
        missing.append("tcmalloc (apt-get install libtcmalloc-minimal4)")
    if find_iomp() is None:
        missing.append("libiomp5.so (pip install intel-openmp)")
    return missing


def reexec_with_cpu_env(**kwargs) -> None:
    """Re-exec the current Python process with :func:`cpu_engine_env` applied (once).

    Call it first thing under ``if __name__ == "__main__":`` of a script that starts an engine.
    """
    if os.environ.get(_REEXEC_MARK) == "1":
        return
    env = cpu_engine_env(**kwargs)
    env[_REEXEC_MARK] = "1"
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable] + sys.argv)
    os.execve(sys.executable, [sys.executable] + argv[1:], env)
