"""The many-ranks path's engine (`moetune.scale`): where the map runs. A Dask `distributed`
client on an attached scheduler (`--scheduler`, `--scheduler-file`) or on a `LocalCluster` started
here (one single-threaded worker process per core, each under a memory limit), and the progress
line of the map."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from moetune.errors import UserError
from moetune.progress import DELAY_S, SPIN, TICK_S

IN_PROCESS_MAX = 4  # files left to summarise at or below which no cluster is started
WORKER_MEMORY = 1_500_000_000  # bytes per LocalCluster worker: no process above 1.5 GB
MIN_WORKER_GB = 0.5
CONNECT_TIMEOUT_S = 10
INSTALL_HINT = "pip install 'moetune[scale]'"


@dataclass(frozen=True)
class ScaleOptions:
    """How to run the map (see the module doc); every field has a working default."""

    cache: Path | None = None
    scheduler: str | None = None
    scheduler_file: Path | None = None
    workers: int | None = None  # LocalCluster workers (default: the cores)
    worker_memory: int = WORKER_MEMORY
    in_process_max: int = IN_PROCESS_MAX
    window: str | None = None
    step_range: str | None = None
    progress: bool = True

    @property
    def attached(self) -> bool:
        return bool(self.scheduler or self.scheduler_file)


def has_dask() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("distributed") is not None
    except (ImportError, ValueError):  # a blocked or broken install counts as none
        return False


def _dask() -> Any:
    try:
        import distributed
    except ImportError:
        raise UserError(f"summarising many ranks needs Dask: {INSTALL_HINT}") from None
    return distributed


def on_dask(map_one: Callable[..., dict[str, Any]], files: list[Path], todo: list[int],
            cache: Path, okey: str, opts: ScaleOptions, prog: Progress
            ) -> tuple[str, dict[int, dict[str, Any]], dict[str, int]]:
    """The files of `todo` mapped on a cluster (attached, or a LocalCluster started here) by
    `map_one` (moetune.scale's: it runs on the workers, so it is passed, not imported here)."""
    distributed = _dask()
    with _client(distributed, opts, len(todo)) as (client, engine):
        prog.engine = engine
        futures = {}
        run = uuid.uuid4().hex[:12]  # keys unique to this run: a shared scheduler never
        # hands one run's result to another that mapped a file at the same position
        _reset_peaks(client)
        for i in todo:
            fut = client.submit(map_one, str(files[i]), i, str(cache), okey, opts.window,
                                opts.step_range, pure=False, key=f"moetune-map-{run}-{i}")
            futures[fut.key] = (i, fut)
        out: dict[int, dict[str, Any]] = {}
        try:
            for fut in distributed.as_completed([f for _, f in futures.values()],
                                               loop=client.loop):
                i = futures[fut.key][0]
                try:
                    out[i] = fut.result()
                except distributed.KilledWorker:
                    more = ("give the cluster's workers more memory" if opts.attached else
                            f"its limit is {opts.worker_memory / 1e9:g} GB: --worker-memory GB")
                    raise UserError(f"the workers summarising it were killed (out of memory? "
                                    f"{more})", path=files[i]) from None
                if "error" in out[i]:
                    raise UserError(out[i]["error"])  # the first bad file stops the run
                prog.advance(out[i]["cached"])
        finally:
            for _, f in futures.values():
                f.cancel()
        peak = _worker_peaks(client)
    return engine, out, peak


@contextlib.contextmanager
def _client(distributed: Any, opts: ScaleOptions, n: int) -> Iterator[tuple[Any, str]]:
    """A connected client and the engine's name; a LocalCluster lives as long as the block."""
    import logging

    if opts.attached:
        address = _scheduler_address(distributed, opts)
        try:
            client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise UserError(f"cannot reach the Dask scheduler ({text[:200]})",
                            path=opts.scheduler_file or address) from None
        try:
            yield client, f"scheduler {client.scheduler.address}"
        finally:
            client.close()
        return
    workers = max(1, min(opts.workers or _cores(), n))
    # Workers are single-threaded processes: polars in each gets one thread, so N workers use
    # N cores rather than N² threads fighting over them.
    saved = os.environ.get("POLARS_MAX_THREADS")
    os.environ["POLARS_MAX_THREADS"] = "1"
    try:
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True,
            memory_limit=opts.worker_memory, dashboard_address=None,
            # no dashboard; the scheduler's HTTP endpoint on a free port, not 8787, which
            # another cluster on this machine may hold
            scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.CRITICAL, host="127.0.0.1")  # our one line says it
    finally:
        if saved is None:
            os.environ.pop("POLARS_MAX_THREADS", None)
        else:
            os.environ["POLARS_MAX_THREADS"] = saved
    try:
        client = distributed.Client(cluster, set_as_default=False)
        try:
            yield client, f"local cluster, {workers} worker{'s' if workers != 1 else ''}"
        finally:
            client.close()
    finally:
        cluster.close()


def _scheduler_address(distributed: Any, opts: ScaleOptions) -> str:
    """The scheduler's address, from the option or its scheduler file, checked before Dask gets
    it: a plain TCP connect says at once that nobody listens (Dask would retry until its
    timeout, and a client that never connected leaves noise on stderr at exit)."""
    import socket

    where: str | Path
    if opts.scheduler_file is not None:
        where = opts.scheduler_file
        try:
            info = json.loads(opts.scheduler_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError("no such scheduler file", path=where) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"not a Dask scheduler file ({exc})".splitlines()[0],
                            path=where) from None
        address = info.get("address") if isinstance(info, dict) else None
        if not isinstance(address, str) or not address:
            raise UserError("not a Dask scheduler file (no address in it)", path=where)
    else:
        where = address = str(opts.scheduler)
    try:
        scheme, _ = distributed.comm.parse_address(address)
        distributed.comm.registry.get_backend(scheme)  # an unknown scheme: ValueError here
        host, port = (distributed.comm.get_address_host_port(address) if scheme in ("tcp", "tls")
                      else (None, None))
    except (ValueError, TypeError) as exc:
        raise UserError(f"not a Dask scheduler address {address!r} ({exc})", path=where) from None
    if host is not None:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            raise UserError(f"cannot reach the Dask scheduler at {address} "
                            f"({exc.strerror or exc})", path=where) from None
    return address


def _reset_peaks(client: Any) -> None:
    """Start every worker's peak from its resident memory now, so the peak is this run's."""
    with contextlib.suppress(Exception):  # a measurement, never a reason to fail the run
        client.run(_reset_peak_rss)


def _reset_peak_rss() -> None:
    # a spawned worker inherits its parent's high-water mark across fork and exec;
    # Linux ≥ 4.0 resets it to the current RSS on "5" (proc(5), clear_refs)
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _worker_peaks(client: Any) -> dict[str, int]:
    """Peak resident memory of every worker process (bytes), as its kernel counted it."""
    try:
        return {str(k): int(v) for k, v in client.run(_peak_rss).items()}
    except Exception:  # a measurement, never a reason to fail the run
        return {}


def _peak_rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _cores() -> int:
    from moetune.analyzer.readers.cores import cpu_count

    return cpu_count()


class Progress:
    """`⠋ summarising ranks 37/512 (12 cached) · local cluster, 2 workers … 12.3 s` on stderr,
    as `moetune.progress` does it: a terminal only, after a second, erased at the end."""

    def __init__(self, total: int, done: int, enabled: bool, stream: TextIO | None) -> None:
        self.total, self.done, self.cached = total, done, done
        self.engine = "in-process"
        self.err = stream or sys.stderr
        self.enabled = enabled and getattr(self.err, "isatty", lambda: False)()
        self._stop = threading.Event()
        self._shown = False
        self._t0 = time.monotonic()
        self._thread: threading.Thread | None = None

    def advance(self, cached: bool) -> None:
        self.done += 1
        self.cached += bool(cached)

    def line(self) -> str:
        return (f"summarising ranks {self.done}/{self.total} ({self.cached} cached) · "
                f"{self.engine} … {time.monotonic() - self._t0:,.1f} s")

    def _tick(self) -> None:
        if self._stop.wait(DELAY_S):
            return
        i = 0
        while not self._stop.is_set():
            self.err.write(f"\r{SPIN[i % len(SPIN)]} {self.line()} ")
            self.err.flush()
            self._shown = True
            i += 1
            self._stop.wait(TICK_S)

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread = threading.Thread(target=self._tick, name="moetune-scale-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            self.err.write("\r\033[K")
            self.err.flush()

