"""What dynamo's guards cost a call, with and without torch's recursive dict tags.

    python bench/torch_guard_cost.py [--model mobilenet_v2|gpt2_hf|llama_hf] [--calls 2000]
                                     [--rounds 7]

A zoo model's torch mirror (bench/zoo_torch.py) compiled with a backend that runs the
graph once and then returns that stored output: a call is dynamo's frame and guards alone.
Timed hot (the same call repeated; the minimum over `--rounds` of `--calls` calls), one
thread, once with `torch._dynamo.config.use_recursive_dict_tags_for_guards` on and once off,
each in a process of its own. A decoder of bench/torch_decode.py (`gpt2_hf`, `llama_hf`:
needs transformers) is timed as a greedy static-cache generate of 64 tokens instead, its
`forward` compiled the same way (the tokens are garbage; the time a token is generate's own
loop, dynamo's frame and its guards). docs/torch_backend.md ("Options") has the figures behind
`torch_backend.GUARD_TAGS_SAFE`. Needs torch; never imported by dnnc.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def one(model: str, tags: bool, calls: int, rounds: int) -> float:
    """Microseconds a call of `model`'s compiled mirror, in this process."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dnnc.zoo as zoo
    from zoo_torch import module_for

    torch.set_num_threads(1)
    torch._dynamo.config.use_recursive_dict_tags_for_guards = tags

    def stored(gm, example_inputs):
        out = gm(*example_inputs)
        return lambda *args: out

    if model in DECODERS:
        return _generate(model, stored, rounds)
    module = module_for(zoo.build(model))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        call = torch.compile(module, backend=stored)
        call(x)
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                call(x)
            best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


DECODERS = ("gpt2_hf", "llama_hf")
TOKENS = 64


def _generate(model: str, backend, rounds: int) -> float:
    """Microseconds a token of a greedy static-cache generate of `model` with its forward
    compiled by `backend` (the best of `rounds` generates, after one that compiles)."""
    import torch
    import torch_decode

    decoder = torch_decode.decoder(model, "cpu")
    decoder.forward = torch.compile(decoder.forward, backend=backend)
    ids = torch.randint(3, 5000, (1, 8), generator=torch.Generator().manual_seed(1))
    options = {"max_new_tokens": TOKENS, "do_sample": False, "cache_implementation": "static",
               "pad_token_id": 0, "eos_token_id": None}
    best = float("inf")
    with torch.no_grad():
        decoder.generate(ids, **options)
        for _ in range(rounds):
            start = time.perf_counter()
            decoder.generate(ids, **options)
            best = min(best, time.perf_counter() - start)
    return best / TOKENS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--one", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one(args.model, args.one == "on", args.calls, args.rounds))
        return
    import torch
    times = {}
    for tags in ("on", "off"):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--calls",
                              str(args.calls), "--rounds", str(args.rounds), "--one", tags],
                             capture_output=True, text=True, check=True)
        times[tags] = float(out.stdout.strip().splitlines()[-1])
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, {args.model}: "
          f"tags on {times['on']:.1f} us, off {times['off']:.1f} us a "
          f"{'token' if args.model in DECODERS else 'call'} "
          f"(off / on {times['off'] / times['on']:.2f})")


if __name__ == "__main__":
    main()
