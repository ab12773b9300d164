"""Words every layer shares, defined once."""

from __future__ import annotations

# The four walls a step's time is attributed to, in display order.
WALLS: tuple[str, ...] = ("compute", "communication", "memory", "host")

# "Paced by": which side set the step's length. The host paced it when, for more than half of
# the step, the critical path ran through host calls while the GPU had no work queued (the GPU
# waited for the host: launches, syncs, Python); the GPU (`device`) paced it otherwise (its own
# work and dependencies, or host calls that ran beside queued GPU work, which a faster host
# cannot recover). A 99 %-busy GPU whose every launch sits on the path is GPU-paced; a step of
# thousands of µs-long kernels the host cannot issue fast enough is host-paced.
PACED_BY_WHO = {"host": "the host", "device": "the GPU"}  # "paced by …" (the report's verdict)
PACED_BY_LABEL = {"host": "host-paced", "device": "GPU-paced"}  # the terminal's path line
PACED_BY = {
    "host": "host-paced: for over half the step the GPU sat idle waiting for the host's calls",
    "device": "GPU-paced: the GPU's own work and dependencies set the step's length",
}


def paced_by(length_s: float, host_on_path_s: float, host_gpu_busy_s: float) -> str:
    """`host` or `device` (PACED_BY): the host paced the step when its path time with the GPU
    idle (`host_on_path_s` − `host_gpu_busy_s`) is over half the step's length."""
    return "host" if (host_on_path_s - host_gpu_busy_s) * 2 > length_s else "device"

# Memory-saving recompute: forward work re-run inside backward (activation checkpointing) so that
# its activations need not be kept. It exists to save memory, so its GPU time is a memory cost:
# the memory wall (analyzer/walls.py), the critical path's memory part (analyzer/path_summary.py)
# and the evidence all count the same kernels, each showing it as its own line. Its share of
# compute (`observed.recompute_fraction`) divides by all compute-kernel time, re-runs included.
RECOMPUTE = "memory-saving recompute"
RECOMPUTE_MEANING = "forward work re-run in backward to save activation memory; a memory cost"
RECOMPUTE_SHARE = "of all compute-kernel time (first runs and re-runs)"

# The terminal's shorthand, each term explained once: `key_lines` picks the ones a text uses
# (recommend prints them as its key, after the recommendations).
GLOSSARY: dict[str, str] = {
    "[preview]": "the rule's status (rules/*.yaml): its thresholds and gain range may still "
                 "change; measure the change (moetune run) before relying on it",
    "help:": "the Megatron-LM command-line flags that make the change (`help: remove …`: flags "
             "to drop, the change restores Megatron's default)",
    "bridge:": "the same change as Megatron-Bridge config overrides (run_recipe.py key=value)",
    "ceiling": "the most the change could gain: the step replayed without all the time it "
               "attacks (the gain range lies below it)",
    "unlocks:": "a change this one makes possible, with its own predicted gain on top",
    "verify:": "what to check after the change: the audit confirming it ran, and the metric's "
               "expected move",
}


def key_lines(text: str) -> list[str]:
    """`key: <term> <meaning>` for each GLOSSARY term `text` uses, in GLOSSARY's order."""
    return [f"key: {term} {meaning}" for term, meaning in GLOSSARY.items()
            if f"\n{term}" in f"\n{text}" or f" {term}" in text]


def step_ids(ids: list[int]) -> str:
    """Step ids as text: a run of three or more as `3–6`, else listed (`10`; `1, 5`)."""
    if not ids:
        return "none"
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}"
    return ", ".join(map(str, ids))


def steps_label(ids: list[int]) -> str:
    """`step 10` for one step, `steps 3–6` for several: a header's ids, never read as a count."""
    return f"step{'s' if len(ids) != 1 else ''} {step_ids(ids)}"
