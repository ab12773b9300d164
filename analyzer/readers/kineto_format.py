"""The Kineto JSON format as the reader decodes it: the fields it reads and their JSON keys
(msgspec Structs), the event categories and phases it maps to frame kinds, and the args each kind
of row carries.

msgspec decodes straight into these Structs, which declare only the fields we use, so unknown keys
(`metadata`, env blocks, `Input Dims`, …) are skipped without ever becoming Python objects. Only
whitelisted top-level fields (`distributedInfo`, `deviceProperties`, `baseTimeNanoseconds`) are
decoded at all: harness metadata may carry credentials (torch.profiler's `add_metadata_json` takes
any top-level key a harness hands it, and libkineto's output_json.cpp writes it verbatim). The
compiled scanner (`kineto_scan.py`) takes its JSON keys from these Structs too.
"""

from __future__ import annotations

from typing import Any

import msgspec

# A JSON scalar as some writer may spell a number (old writers quote numbers; ROCm writes "0x0").
Num = int | float | str | None
# Split sizes and process-group ranks are strings in Kineto ("[0, 1]") but lists in some writers.
StrOrList = str | list[Any] | None

KIND_OF_CAT: dict[str, str] = {
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "Runtime": "runtime",
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_sync": "sync",
}
# Rows that live on a GPU stream: pid = device, tid = stream in the file.
DEVICE_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync")
SYNC_KIND_OF_NAME = {
    "Stream Sync": "stream_sync",
    "Event Sync": "event_sync",
    "Context Sync": "context_sync",
    "Stream Wait Event": "stream_wait_event",
}
COPY_KINDS_IN_NAME = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")

GPU_CATS = (
    "kernel",
    "Kernel",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "cuda_sync",
    "gpu_user_annotation",
)
# `ph` and `cat` are hashed once per row, into the codes every later mask reads (flows, timed
# rows, instants, GPU rows, kernels, kind): string `is_in`s cost ~10 ns a row each.
PH_TIMED, PH_INSTANT, PH_FLOW = 1, 2, 3
PH_CODE = {"X": 1, "C": 1, "B": 1, "E": 1, "i": 2, "I": 2, "s": 3, "f": 3, "t": 3}
GPU_CAT_KINDS = sorted({KIND_OF_CAT[c] for c in GPU_CATS})  # cat ∈ GPU_CATS ⇔ kind ∈ these
GPU_ARG_FIELDS = (
    "device",
    "stream",
    "bytes",
    "graph_id",
    "graph_node_id",
    "wait_on_stream",
    "wait_on_cuda_event_record_corr_id",
)
# Collective metadata (`record_param_comms` and NCCL kernels), after `collective` itself.
META_INT_FIELDS = ("in_nelems", "out_nelems", "group_size", "seq")
META_STR_FIELDS = ("dtype", "pg_name", "pg_desc")
META_SPLIT_FIELDS = ("in_split", "out_split", "pg_ranks")  # Kineto strings; lists in some writers
COMM_EVENT = "record_param_comms"  # the host op PyTorch puts collective metadata on
MEMORY_EVENT = "[memory]"
MEMORY_ARG_FIELDS = ("mem_device_type", "mem_device", "mem_bytes", "total_allocated",
                     "total_reserved")

# `[memory]` instants (profile_memory=True): the caching allocator's state after each event
_MEM_KEYS = {"mem_device_type": "Device Type", "mem_device": "Device Id", "mem_bytes": "Bytes",
             "total_allocated": "Total Allocated", "total_reserved": "Total Reserved"}


class _MemArgs(msgspec.Struct, frozen=True, gc=False, rename=_MEM_KEYS):
    mem_device_type: Num = None
    mem_device: Num = None
    mem_bytes: Num = None
    total_allocated: Num = None
    total_reserved: Num = None


class _Args(
    _MemArgs,
    frozen=True,
    gc=False,
    rename={
        "external_id": "External id",
        "graph_id": "graph id",
        "graph_node_id": "graph node id",
        "collective": "Collective name",
        "in_nelems": "In msg nelems",
        "out_nelems": "Out msg nelems",
        "group_size": "Group size",
        "in_split": "In split size",
        "out_split": "Out split size",
        "pg_name": "Process Group Name",
        "pg_desc": "Process Group Description",
        "pg_ranks": "Process Group Ranks",
        "seq": "Seq",
        **_MEM_KEYS,
    },
):
    """Every arg we read (the allocator's five come from `_MemArgs`)."""

    external_id: Num = None
    correlation: Num = None
    device: Num = None
    stream: Num = None
    bytes: Num = None
    graph_id: Num = None
    graph_node_id: Num = None
    wait_on_stream: Num = None
    wait_on_cuda_event_record_corr_id: Num = None
    collective: Num = None
    in_nelems: Num = None
    out_nelems: Num = None
    group_size: Num = None
    dtype: Num = None
    in_split: StrOrList = None
    out_split: StrOrList = None
    pg_name: Num = None
    pg_desc: Num = None
    pg_ranks: StrOrList = None
    seq: Num = None


_NO_ARGS = _Args()
_ARG_FIELDS = _Args.__struct_fields__
_ARG_KEYS = {_Args.__struct_encode_fields__[i]: f for i, f in enumerate(_ARG_FIELDS)}
_ARG_KEY_OF = {f: k for k, f in _ARG_KEYS.items()}


class _Event(msgspec.Struct, gc=False):
    ph: Num = None
    cat: Num = None
    name: Num = None
    pid: Num = None
    tid: Num = None
    ts: Num = None
    dur: Num = None
    id: Num = None
    args: _Args = _NO_ARGS


_EVENT_FIELDS = tuple(f for f in _Event.__struct_fields__ if f != "args")


class _LeanArgs(msgspec.Struct, frozen=True, gc=False, rename={"external_id": "External id"}):
    """The two args every row needs; the rest (`_Args`) are decoded for GPU/collective rows only
    (9–12 % of rows), from their raw slices: smaller Structs, fewer ints to build and free.
    (Adding the five allocator fields here cost every row +13 % CPU; `[memory]` rows are decoded
    a second time instead, with `_MemOnly`.)"""

    external_id: Num = None
    correlation: Num = None


class _MemOnly(msgspec.Struct, gc=False):
    args: _MemArgs = _MemArgs()


_NO_LEAN_ARGS = _LeanArgs()


class _LeanEvent(_Event, gc=False):
    """`_Event` with only the args every row needs."""

    args: _LeanArgs = _NO_LEAN_ARGS  # type: ignore[assignment]


class _ArgsOnly(msgspec.Struct, gc=False):
    args: _Args = _NO_ARGS


class _Device(msgspec.Struct, gc=False):
    id: Num = None
    name: Num = None
    totalGlobalMem: Num = None
    numSms: Num = None
    computeMajor: Num = None
    computeMinor: Num = None


class _Dist(msgspec.Struct, gc=False):
    backend: Num = None
    rank: Num = None
    world_size: Num = None
    nccl_version: Num = None


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    deviceProperties: list[_Device] | None = None
    distributedInfo: _Dist | None = None
    baseTimeNanoseconds: Num = None


class _RawDoc(msgspec.Struct, gc=False):
    """Fast path: events left as raw JSON slices, decoded `kineto_columns.CHUNK` at a time so
    that only one chunk's Structs (≈0.5 KB per event with their ints and strings) are alive at
    once."""

    traceEvents: list[msgspec.Raw] | None = None
    deviceProperties: list[_Device] | None = None
    distributedInfo: _Dist | None = None
    baseTimeNanoseconds: Num = None
