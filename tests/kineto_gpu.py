"""Small GPU Kineto traces written by tests, row for row in the shape PyTorch's profiler writes
them (studied on fixtures/traces/gpu_mcore_recompute_full: `cpu_op` rows with External id,
`cuda_runtime` launches with cbid and correlation, `kernel` / `gpu_memcpy` rows on pid = device,
tid = stream with the same correlation, `ac2g` flow pairs, `ProfilerStep#N` annotations, an H200
in deviceProperties). Times are µs from the trace's start, as Kineto writes them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

PID = 1027        # the training process
MAIN = 1027       # its main thread (forward, optimizer)
AUTOGRAD = 1109   # the autograd engine's device thread (backward)
STREAM = 7
T0 = 5109605706000.0  # µs, a real trace's epoch-like origin
GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
        "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
        "{lambda()#1}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
        "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()"
        "#2}::operator()() const::{lambda()#1}::operator()() const::{lambda(float)#1}, "
        "std::array<char*, 2ul>)")
H200 = {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
        "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
        "sharedMemPerMultiprocessor": 233472}


class KinetoTrace:
    """Append rows with `op`, `kernel`, `copy`, `step`; `write` the JSON (gzipped on .gz)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "ts": T0, "pid": PID, "tid": 0, "args": {"name": "python3"}},
            {"name": "thread_name", "ph": "M", "ts": T0, "pid": PID, "tid": MAIN,
             "args": {"name": "thread 1027 (python3)"}},
            {"name": "thread_name", "ph": "M", "ts": T0, "pid": PID, "tid": AUTOGRAD,
             "args": {"name": "thread 1109 (python3)"}},
        ]
        self.ext = 66000
        self.corr = 485000

    def _next_ext(self) -> int:
        self.ext += 1
        return self.ext

    def step(self, n: int, ts: float, dur: float) -> None:
        self.rows.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": PID,
                          "tid": MAIN, "ts": T0 + ts, "dur": dur,
                          "args": {"External id": self._next_ext(), "Record function id": 0}})

    def op(self, name: str, ts: float, dur: float, *, tid: int = MAIN) -> int:
        ext = self._next_ext()
        self.rows.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid,
                          "ts": T0 + ts, "dur": dur,
                          "args": {"External id": ext, "Record function id": 0, "Ev Idx": len(self.rows)}})
        return ext

    def _launch(self, api: str, cbid: int, ts: float, tid: int, ext: int) -> int:
        self.corr += 1
        self.rows.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": PID, "tid": tid,
                          "ts": T0 + ts, "dur": 4.0,
                          "args": {"External id": ext, "cbid": cbid, "correlation": self.corr}})
        self.rows.append({"ph": "s", "id": self.corr, "pid": PID, "tid": tid, "ts": T0 + ts,
                          "cat": "ac2g", "name": "ac2g"})
        return self.corr

    def kernel(self, name: str, launch_ts: float, start: float, dur: float, *, tid: int = MAIN,
               ext: int | None = None) -> None:
        """cudaLaunchKernel at `launch_ts` on host thread `tid`, the kernel at `start` on stream 7."""
        ext = ext if ext is not None else self._next_ext()
        corr = self._launch("cudaLaunchKernel", 211, launch_ts, tid, ext)
        self.rows.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": STREAM,
                          "ts": T0 + start, "dur": dur,
                          "args": {"External id": ext, "queued": 0, "device": 0, "context": 1,
                                   "stream": STREAM, "correlation": corr, "registers per thread": 32,
                                   "shared memory": 0, "grid": [132, 1, 1], "block": [384, 1, 1]}})
        self.rows.append({"ph": "f", "id": corr, "pid": 0, "tid": STREAM, "ts": T0 + start,
                          "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def copy(self, direction: str, ends: str, nbytes: int, launch_ts: float, start: float, dur: float,
             *, tid: int = MAIN, stream: int = STREAM) -> None:
        """cudaMemcpyAsync and its `gpu_memcpy` row, named as CUPTI names it:
        `Memcpy DtoH (Device -> Pageable)`."""
        ext = self._next_ext()
        corr = self._launch("cudaMemcpyAsync", 41, launch_ts, tid, ext)
        self.rows.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {direction} ({ends})",
                          "pid": 0, "tid": stream, "ts": T0 + start, "dur": dur,
                          "args": {"External id": ext, "device": 0, "context": 1, "stream": stream,
                                   "correlation": corr, "bytes": nbytes,
                                   "memory bandwidth (GB/s)": nbytes / (dur * 1e3)}})
        self.rows.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": T0 + start,
                          "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def write(self, path: Path) -> Path:
        doc = {"schemaVersion": 1, "deviceProperties": [H200], "cuda_driver_version": 13000,
               "cuda_runtime_version": 13000, "displayTimeUnit": "ms",
               "baseTimeNanoseconds": 1790857026000000000, "traceEvents": self.rows,
               "traceName": path.name}
        raw = json.dumps(doc).encode()
        path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
        return path
