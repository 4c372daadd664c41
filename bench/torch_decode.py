"""Greedy decoding with a static KV cache (transformers' `generate`, cache_implementation=
"static") through torch.compile(backend="dnnc") next to inductor and eager, in one run:
tokens per second at each batch size.

    python bench/torch_decode.py [--models gpt2_hf,llama_hf] [--batches 1,8] [--prompt 32]
                                 [--tokens 64] [--target llvm|cuda] [--threads 2] [--repeat 3]
                                 [--order alternate|alone]

Models are bench/library_models.py's decoders (2 layers at the originals' widths, random seeded
weights). Each runtime compiles `model.forward` (on cuda, inductor with mode="reduce-overhead"
as issue 35 compares, the way transformers compiles it there: `transformers_compile`, the
decode step compiled, the prefill eager), runs one untimed generate
(prefill and decode compiles), then `--repeat` timed ones: by default in alternating rounds
(each runtime once a round, the order reversed every other round: one process's speed drifts
by 20-50% over a device call, which timing the runtimes one after the other took for their
difference), or `--order alone`, each runtime's in a row. Prints the median tokens/s (new
tokens x batch / seconds), the ratio of tokens/s dnnc / inductor (above 1: dnnc decodes faster;
issue 35 asks >= 1), `wins` (the share of rounds whose dnnc generate beat inductor's), the
graphs the backend compiled (2: prefill and decode), the decode step's dnnc partitions and ops
left in torch (`parts`, `torch`: 1 and 0 once the cache writes are dnnc's), whether its
tokens equal eager's, and the seconds of each compiled runtime's first generate (its
compiles). `--runtimes` times a subset (eager is always run: its tokens are the
reference); `--cpu-time` times by the process's CPU time (a loaded machine; meant for
`--threads 1`, where no worker spins).
generate's own compile is off for every other runtime (`decoder`). Needs torch and transformers;
never imported by dnnc.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import library_models  # noqa: E402

from dnnc.compiler import torch_backend  # noqa: E402


def decoder(name: str, device: str) -> torch.nn.Module:
    """The transformers model inside library_models' `name` (its wrapper drops the cache),
    with generate's own compile off: on cuda, generate with a static cache otherwise wraps
    the model in torch.compile(mode="reduce-overhead") of inductor itself, around whichever
    runtime is measured (eager included), and compiles it again for every model."""
    wrapped, _ = library_models.build(name)
    model = wrapped.model.to(device)
    model.generation_config.disable_compile = True
    return model


def transformers_compile(model) -> None:
    """inductor with reduce-overhead as transformers itself compiles a static-cache generate
    on a GPU (its `compile_config`, the default when generate runs there): the decode step's
    forward compiled, the prefill eager, the cache's tensors made before any CUDA graph and
    marked static. Compiling `model.forward` for every call instead, CUDA-graph trees took
    the prefill's lazily made cache for a graph's output and refused it once a later replay
    overwrote it ("accessing tensor output of CUDAGraphs that has been overwritten by a
    subsequent run", transformers 4.5x / 5.x, torch 2.11, H200), with or without a step mark
    per call and the outputs cloned."""
    import transformers

    model.generation_config.disable_compile = False
    model.generation_config.compile_config = transformers.CompileConfig(mode="reduce-overhead")


def generate_options(args) -> dict:
    return {"max_new_tokens": args.tokens, "do_sample": False,
            "cache_implementation": "static", "pad_token_id": 0, "eos_token_id": None}


def timed_generate(model, ids, args) -> tuple[float, torch.Tensor]:
    """Tokens/s of one generate (wall clock, or the process's CPU time) and its tokens."""
    clock = time.process_time if args.cpu_time else time.perf_counter
    start = clock()
    out = model.generate(ids, **generate_options(args))
    if ids.is_cuda:
        torch.cuda.synchronize()
    return args.tokens * ids.shape[0] / (clock() - start), out


def compiled_decoder(name: str, runtime: str, device: str, target: str):
    model = decoder(name, device)
    if runtime == "inductor" and device == "cuda":
        transformers_compile(model)
    elif runtime == "inductor":
        model.forward = torch.compile(model.forward)
    elif runtime == "dnnc":
        model.forward = torch.compile(model.forward, backend=torch_backend.dnnc_backend,
                                      options={"target": target})
    return model


def measure(name: str, batch: int, args) -> dict:
    """One row: every runtime compiled and run once (its compiles: `firsts`), then
    `--repeat` timed generates each, alone (one runtime's in a row, right after its first)
    or alternating (a round times each runtime once, the order reversed every other round,
    so a drift of the machine's speed reaches all alike; `wins`: the share of rounds in which
    dnnc's rate beat inductor's)."""
    device = "cuda" if args.target == "cuda" else "cpu"
    ids = torch.randint(3, 5000, (batch, args.prompt),
                        generator=torch.Generator().manual_seed(batch)).to(device)
    models, samples, firsts, outs, graphs, decode = {}, {}, {}, {}, 0, None
    torch._dynamo.reset()
    for runtime in ("eager", *args.runtimes.split(",")):
        before = len(torch_backend.reports())
        start = time.perf_counter()
        try:
            model = compiled_decoder(name, runtime, device, args.target)
            model.generate(ids, **generate_options(args))   # compiles (prefill, decode)
            firsts[runtime] = time.perf_counter() - start
            samples[runtime] = []
            if args.order == "alone":
                for _ in range(args.repeat):
                    rate, outs[runtime] = timed_generate(model, ids, args)
                    samples[runtime].append(rate)
        except Exception as exc:   # said; the other runtimes still run
            if runtime == "eager":
                raise
            print(f"# {name} batch {batch}, {runtime}: failed ({type(exc).__name__}: "
                  f"{str(exc)[:300]})", flush=True)
            firsts[runtime] = math.nan
            continue
        models[runtime] = model
        if runtime == "dnnc":
            graphs = len(torch_backend.reports()) - before
            decode = torch_backend.reports()[-1]
    if args.order == "alternate":
        for round_ in range(args.repeat):
            order = list(models) if round_ % 2 == 0 else list(models)[::-1]
            for runtime in order:
                rate, outs[runtime] = timed_generate(models[runtime], ids, args)
                samples[runtime].append(rate)
    rates = {k: statistics.median(v) if v else math.nan for k, v in samples.items()}
    paired = list(zip(samples.get("dnnc", []), samples.get("inductor", [])))
    return {"rates": rates, "firsts": firsts, "graphs": graphs,
            "wins": sum(d > i for d, i in paired) / len(paired) if paired else math.nan,
            "parts": decode.partitions if decode else 0,
            "torch": sum(decode.torch_ops.values()) if decode else 0,
            "same": "dnnc" in outs and bool(torch.equal(outs["dnnc"].cpu(),
                                                         outs["eager"].cpu()))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt2_hf,llama_hf")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--target", default="llvm", choices=("llvm", "cuda"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by the process's CPU time (with --threads 1)")
    parser.add_argument("--runtimes", default="inductor,dnnc",
                        help="besides eager: inductor, dnnc or both")
    parser.add_argument("--order", default="alternate", choices=("alternate", "alone"),
                        help="time the runtimes in alternating rounds, or each alone")
    args = parser.parse_args(argv)
    os.environ["DNNC_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    if args.target == "cuda":   # fp32 products in eager and inductor, as dnnc's default
        torch.backends.cuda.matmul.allow_tf32 = False
    machine = torch.cuda.get_device_name() if args.target == "cuda" else \
        (platform.processor() or platform.machine())
    print(f"# {machine}, {args.target}, {args.threads} threads; torch {torch.__version__}; "
          f"prompt {args.prompt}, {args.tokens} new tokens, median of {args.repeat} "
          f"({args.order}), tokens/s{' of CPU time' if args.cpu_time else ''}")
    print(f"{'model':12}{'batch':>6}{'eager':>10}{'inductor':>10}{'dnnc':>10}{'dnnc/ind':>9}"
          f"{'wins':>6}{'graphs':>8}{'parts':>6}{'torch':>6}  same tokens  "
          f"first generate s (ind, dnnc)")
    with torch.no_grad():
        for name in args.models.split(","):
            for batch in map(int, args.batches.split(",")):
                try:
                    row = measure(name, batch, args)
                except ImportError as exc:
                    print(f"# {name}: not built ({exc})")
                    break
                except Exception as exc:   # said, and the other rows still run
                    print(f"# {name} batch {batch}: failed ({type(exc).__name__}: "
                          f"{str(exc)[:300]})", flush=True)
                    continue
                r = {k: row["rates"].get(k, math.nan) for k in ("eager", "inductor", "dnnc")}
                first = {k: row["firsts"].get(k, math.nan) for k in ("inductor", "dnnc")}
                print(f"{name:12}{batch:6d}{r['eager']:10.1f}{r['inductor']:10.1f}"
                      f"{r['dnnc']:10.1f}{r['dnnc'] / r['inductor']:9.2f}"
                      f"{row['wins']:6.0%}{row['graphs']:8d}"
                      f"{row['parts']:6d}{row['torch']:6d}  {str(row['same']):11}  "
                      f"{first['inductor']:6.1f} {first['dnnc']:6.1f}", flush=True)


if __name__ == "__main__":
    main()
