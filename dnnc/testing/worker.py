"""The fuzzer's worker process: compiles and runs models for the target under test.

Run as `python -m dnnc.testing.worker` by `fuzz.Worker`, which restarts it after a crash or a
hang, so a signal in generated code ends this process and never the fuzzer. It reads requests
from stdin and writes replies to stdout, each a length-prefixed pickle:
request `{"model": bytes, "runs": [{name: array}, ...], "target": str, "opt_level": int}`,
reply `{"outputs": [[array, ...] per run]}` or `{"error": (exception type, message)}`.
The thread count comes from DNNC_NUM_THREADS in this process's environment, which the fuzzer
sets; anything else printed to stdout (by C code too) goes to stderr, to keep the channel clean.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys

HEADER = struct.Struct("<Q")


def read_message(stream):
    """One message from a binary stream, or None at end of file. The body is read into a
    buffer of the size its header gives: appending chunks (a pipe hands out 64 KiB at a time)
    copied a 150 MB reply ~2400 times and took 121 s (issue 30)."""
    head = _read_exactly(stream, HEADER.size)
    if head is None:
        return None
    size, = HEADER.unpack(head)
    data = _read_exactly(stream, size)
    return None if data is None else pickle.loads(data)


def _read_exactly(stream, size: int) -> bytearray | None:
    """`size` bytes read with `stream.readinto`, or None if the stream ends first."""
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = stream.readinto(view[got:])
        if not n:
            return None
        got += n
    return data


def write_message(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)))
    view = memoryview(data)
    while view:   # an unbuffered pipe may take part of a large write
        view = view[stream.write(view):]
    stream.flush()


def handle(request: dict) -> dict:
    import dnnc

    try:
        precision = request.get("precision", "fp32")
        options = {} if precision == "fp32" else {"precision": precision}
        model = dnnc.compile(request["model"], target=request["target"],
                             opt_level=request["opt_level"], outputs="numpy", **options)
        outputs = []
        for run in request["runs"]:
            outputs.append([o.copy() for o in model.run(**run)])
        return {"outputs": outputs}
    except Exception as exc:   # any failure is a finding the fuzzer reports, not ours to judge
        return {"error": (type(exc).__name__, str(exc)[:2000])}


def main() -> None:
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    while True:
        request = read_message(requests)
        if request is None:
            return
        write_message(channel, handle(request))


if __name__ == "__main__":
    main()
