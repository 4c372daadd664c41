"""XGBoost-guided search against random search, on six llvm tasks, three seeds each.

    python bench/tune_compare.py [--random-trials 1000] [--budget 150] [--seeds 3]
                                 [--tasks dense512,...] [--parallel]

Per task, up to `--random-trials` configs of its knob space (all of it when it is smaller)
are each measured once, in random order, with the tuner's own measurement (`measure.py`:
worker processes, outputs checked against the default config's). The best of them is the bar;
"95%" is 95% of its throughput. Both searches are then replayed over those measurements (a
config's time is its measured time, so the two searches are compared on identical numbers and
the benchmark costs one measurement per config): random search is a random order of the
measured configs; the guided search is `search.ModelSearch` with the tuner's cost model,
proposing among the measured configs only and learning from each batch of 8, as `dnnc tune`
does. The table gives, per task and seed, the trials each search needed to reach 95% (">B"
when the guided search did not within the budget) and the mean over seeds.

The tasks: a 512x512x512 dense; bert_base's FFN dense (128 tokens, 768 -> 3072); resnet50's
3x3 conv (64 channels at 56x56) and 1x1 conv (64 -> 256 at 56x56); mobilenet_v2's depthwise
3x3 conv (144 channels at 56x56); a softmax row (12 heads of 128x128, bert_base's attention).
`--parallel` measures the tasks in parallel processes, one core each (DNNC_NUM_THREADS=1),
for a many-core machine; otherwise one after the other with the inherited thread count.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH = 8


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "task", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _value(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _weights(name, shape, rng):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)


def dense(m, k, n):
    def build(rng):
        return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_value("x", [m, k])],
                      [_value("y", [m, n])], [_weights("w", [k, n], rng)])
    return build


def conv(c, oc, size, kernel, group=1):
    def build(rng):
        pad = kernel // 2
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[kernel, kernel],
                                pads=[pad] * 4, group=group)
        return _model([node, helper.make_node("Relu", ["y"], ["z"])],
                      [_value("x", [1, c, size, size])], [_value("z", [1, oc, size, size])],
                      [_weights("w", [oc, c // group, kernel, kernel], rng),
                       _weights("b", [oc], rng)])
    return build


def softmax(heads, rows, cols):
    def build(rng):
        return _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                      [_value("x", [1, heads, rows, cols])], [_value("y", [1, heads, rows, cols])],
                      [])
    return build


TASKS = {
    "dense512": dense(512, 512, 512),
    "bert_ffn": dense(128, 768, 3072),
    "conv3x3": conv(64, 64, 56, 3),
    "conv1x1": conv(64, 256, 56, 1),
    "depthwise": conv(144, 144, 56, 3, group=144),
    "softmax": softmax(12, 128, 128),
}


def measure_task(name: str, random_trials: int, seed: int) -> dict:
    """Every config of a random sample of the task's space measured once."""
    from dnnc.autotune.measure import measure
    from dnnc.autotune.tasks import extract
    from dnnc.backends.llvm import tuning
    from dnnc.compiler.driver import load_graph
    from dnnc.backends.registry import REGISTRY
    from dnnc.passes.manager import optimize

    rng = np.random.default_rng(seed)
    machine = REGISTRY["llvm"].target()
    graph = optimize(load_graph(TASKS[name](rng)), machine, 3)
    (task,) = extract(graph, tuning)   # the op and its epilogue: one kernel
    space = task.template.space(task.problem, machine)
    default = task.template.default(task.problem, machine)
    (ref,) = measure(tuning, task.kernel, machine, [default])
    configs = space.sample(rng, random_trials)
    results = []
    for k in range(0, len(configs), 16):
        results += measure(tuning, task.kernel, machine, configs[k:k + 16],
                           reference=ref.outputs)
    ok = [(dataclasses.asdict(r.config), r.ms) for r in results if r.error is None]
    print(f"  {name}: {task.template.name}, space {space.product_size}, measured {len(ok)} "
          f"({len(results) - len(ok)} errors), default {ref.ms:.3f} ms", flush=True)
    return {"name": name, "template": task.template.name, "default_ms": ref.ms,
            "measured": ok}


def _task_in_child(name, trials, seed, core, queue):
    # (a Process of its own, not a Pool's: a pool's daemonic workers may not fork the
    # measurement's worker processes)
    os.sched_setaffinity(0, {core})
    queue.put(measure_task(name, trials, seed))


def replay_random(times: list[float], bar: float, rng) -> int:
    """Trials a random order of the measured configs needs to reach `bar` ms."""
    order = rng.permutation(len(times))
    for k, i in enumerate(order, 1):
        if times[i] <= bar:
            return k
    return len(times)


def replay_guided(row: dict, bar: float, budget: int, seed: int) -> int | None:
    """Trials `ModelSearch` needs to reach `bar` ms over the measured configs (None: not
    within `budget`)."""
    from dnnc.autotune.cost_model import CostModel
    from dnnc.autotune.search import ModelSearch
    from dnnc.autotune.records import canonical
    from dnnc.autotune.tasks import extract
    from dnnc.autotune.features import features
    from dnnc.backends.llvm import tuning
    from dnnc.compiler.driver import load_graph
    from dnnc.backends.registry import REGISTRY
    from dnnc.passes.manager import optimize

    machine = REGISTRY["llvm"].target()
    graph = optimize(load_graph(TASKS[row["name"]](np.random.default_rng(0))), machine, 3)
    (task,) = extract(graph, tuning)
    space = task.template.space(task.problem, machine)
    times = {canonical(c): ms for c, ms in row["measured"]}
    configs = [space.check(c) for c, _ in row["measured"]]

    class Measured:   # the task's space restricted to the measured configs
        def sample(self, rng, n):
            picks = rng.permutation(len(configs))[:n]
            return [configs[int(i)] for i in picks]

    model = CostModel(seed)
    feats = {}

    def featurize(c):
        key = canonical(dataclasses.asdict(c))
        if key not in feats:
            feats[key] = features(tuning.build(task.kernel, machine, c))
        return feats[key]

    search = ModelSearch(Measured(), np.random.default_rng(seed), set(), model, featurize)
    trials = 0
    while trials < budget:
        batch = search.next(min(8, budget - trials))
        if not batch:
            return None
        for c in batch:
            trials += 1
            ms = times[canonical(dataclasses.asdict(c))]
            if ms <= bar:
                return trials
            model.add(task.key, featurize(c), row["default_ms"] / ms)
        model.fit()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random-trials", type=int, default=1000)
    parser.add_argument("--budget", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--parallel", action="store_true")
    args = parser.parse_args()
    names = args.tasks.split(",")
    from dnnc.backends.registry import REGISTRY

    machine = REGISTRY["llvm"].target()
    print(f"# llvm on {machine.cpu} ({machine.vector_bits}-bit vectors), "
          f"{'one core per task' if args.parallel else f'{machine.threads} threads'}",
          flush=True)
    if args.parallel:
        os.environ["DNNC_NUM_THREADS"] = "1"
        cores = sorted(os.sched_getaffinity(0))
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        procs = [context.Process(target=_task_in_child,
                                 args=(n, args.random_trials, 0, cores[k % len(cores)], queue))
                 for k, n in enumerate(names)]
        for p in procs:
            p.start()
        done = {row["name"]: row for row in (queue.get() for _ in procs)}
        for p in procs:
            p.join()
        rows = [done[n] for n in names]
    else:
        rows = [measure_task(n, args.random_trials, 0) for n in names]
    print(f"\n{'task':10} {'template':10} {'configs':>7} {'default':>8} {'best ms':>8} "
          f"{'xgb trials to 95% (seeds)':>26} {'mean':>5} {'random mean':>11}")
    means = []
    for row in rows:
        times = [ms for _, ms in row["measured"]]
        best = min(times)
        bar = best / 0.95
        guided = [replay_guided(row, bar, args.budget, s) for s in range(args.seeds)]
        rand = [replay_random(times, bar, np.random.default_rng(s)) for s in range(100)]
        shown = " ".join(f">{args.budget}" if g is None else str(g) for g in guided)
        mean = np.mean([args.budget + 1 if g is None else g for g in guided])
        means.append(mean)
        print(f"{row['name']:10} {row['template']:10} {len(times):7d} "
              f"{row['default_ms']:8.3f} {best:8.3f} {shown:>26} {mean:5.0f} "
              f"{np.mean(rand):11.0f}")
    print(f"mean over tasks: xgb {np.mean(means):.0f} trials to 95% of the best of the "
          f"measured configs")


if __name__ == "__main__":
    main()
