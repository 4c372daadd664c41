"""A kernel profile as a Chrome trace: the Trace Event Format that chrome://tracing, Perfetto
(ui.perfetto.dev), onnxruntime's profiler and torch.profiler's `export_chrome_trace` share.

`chrome_trace` lays each lane's kernels (`CompiledModel.profile` rows, in call order) end to
end as complete events ("ph": "X", `ts` and `dur` in microseconds), one thread per lane (a
batch size of `dnnc bench --batch 1,8`), named by metadata events ("ph": "M"). Each kernel
was timed alone (its median over repeated calls), so the timeline is the sum of those medians
in call order, not one traced call: it shows where a call's time goes, without the per-call
overhead between kernels. This module only formats; it never times anything.
"""

from __future__ import annotations

PID = 1


def chrome_trace(lanes: dict[str, list[dict]], process: str, metadata: dict | None = None
                 ) -> dict:
    """{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": metadata}: per lane
    (name -> profile rows), a thread of complete events, one per kernel, named after the
    kernel's function with its nodes and share of the lane's time in `args`."""
    events = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0,
               "args": {"name": process}}]
    for tid, (lane, rows) in enumerate(lanes.items(), start=1):
        events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid,
                       "args": {"name": lane}})
        total = sum(r["ms"] for r in rows) or 1.0
        start = 0.0
        for index, row in enumerate(rows):
            events.append({"name": row["kernel"], "cat": "kernel", "ph": "X", "pid": PID,
                           "tid": tid, "ts": round(start * 1e3, 3),
                           "dur": round(row["ms"] * 1e3, 3),
                           "args": {"index": index, "nodes": row["nodes"],
                                    "share": round(row["ms"] / total, 4)}})
            start += row["ms"]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(metadata or {})}
