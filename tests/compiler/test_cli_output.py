"""What the `dnnc` command prints, run as users run it (`python -m dnnc` in a subprocess): the
version, -q / -v / --json on every command, messages through the `dnnc` logger, and
docs/cli.md documenting only flags that exist."""

import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.compiler.cli import build_parser, main
from dnnc.backends.registry import REGISTRY, default_target
from dnnc.frontend.onnx import import_onnx

REPO = Path(__file__).resolve().parents[2]


def dnnc_command(*argv, cwd):
    """The real command in a fresh process: (exit status, stdout, stderr)."""
    result = subprocess.run([sys.executable, "-m", "dnnc", *map(str, argv)],
                            capture_output=True, text=True, cwd=cwd,
                            env={"PYTHONPATH": str(REPO), "PATH": "", "DNNC_CACHE": "0"},
                            timeout=300)
    return result.returncode, result.stdout, result.stderr


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A small MLP (batch 2, 8 -> 16 -> 3) as ONNX."""
    folder = tmp_path_factory.mktemp("cli")
    path = folder / "mlp.onnx"
    code, _, err = dnnc_command("zoo", "mlp", "-o", path, "--batch", "2", "--set",
                                "hidden=(16,)", "--set", "in_features=8", "--set", "classes=3",
                                "-q", cwd=folder)
    assert code == 0 and err == ""
    return path


def commands() -> dict:
    return build_parser()._subparsers._group_actions[0].choices


def test_version_names_dnnc_every_target_and_the_default(tmp_path):
    code, out, err = dnnc_command("--version", cwd=tmp_path)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"dnnc {dnnc.__version__} (Python ")
    for name, spec in REGISTRY.items():
        (line,) = [line for line in lines if line.split()[:1] == [name]]
        assert line.split()[1] == ("yes" if spec.available() else "no"), line
    llvm = next(line for line in lines if line.split()[:1] == ["llvm"])
    assert re.search(r"llvmlite [\d.]+, LLVM \d+\.\d+", llvm), llvm
    assert lines[-1] == f"default target: {default_target()}"


def test_every_command_takes_quiet_verbose_and_json():
    for name, parser in commands().items():
        flags = {s for a in parser._actions for s in a.option_strings}
        assert {"-q", "--quiet", "-v", "--verbose", "--json"} <= flags, name


def test_quiet_and_verbose_exclude_each_other(tmp_path, mlp):
    code, out, err = dnnc_command("inspect", mlp, "-q", "-v", cwd=tmp_path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "not allowed" in err


def test_compile_messages_quiet_default_and_verbose(tmp_path, mlp):
    out_file = tmp_path / "m.dnnc"
    code, out, err = dnnc_command("compile", mlp, "-o", out_file, "-q", cwd=tmp_path)
    assert code == 0 and err == "" and out.startswith(f"wrote {out_file}")
    code, _, err = dnnc_command("compile", mlp, "-o", out_file, cwd=tmp_path)
    lines = err.splitlines()
    assert code == 0 and all(line.startswith("dnnc: ") for line in lines)
    assert any(line.startswith("dnnc: compiling segment 0: ") for line in lines)
    assert not any(" pass " in line for line in lines)
    code, _, verbose = dnnc_command("compile", mlp, "-o", out_file, "-v", cwd=tmp_path)
    assert code == 0 and set(lines) - {x for x in lines if "compiled in" in x} <= \
        set(verbose.splitlines())
    assert re.search(r"^dnnc: pass fuse_ops: [\d.]+ ms, \d+ node\(s\)$", verbose, re.M), verbose


def test_json_of_zoo_inspect_compile_run_and_compare(tmp_path, mlp):
    code, out, err = dnnc_command("zoo", "--list", "--json", cwd=tmp_path)
    defaults = {n: zoo.config_defaults(n) for n in zoo.MODELS}   # tuples as JSON lists
    assert code == 0 and json.loads(out) == json.loads(json.dumps(defaults))
    assert list(json.loads(out)["mlp"]) == zoo.config_options("mlp")
    code, out, _ = dnnc_command("zoo", "cnn", "-o", tmp_path / "c.onnx", "--json", cwd=tmp_path)
    doc = json.loads(out)
    assert code == 0 and doc["model"] == "cnn" and doc["parameters"] > 0 and doc["nodes"] > 10

    code, out, _ = dnnc_command("inspect", mlp, "--json", "--ir", cwd=tmp_path)
    doc = json.loads(out)
    assert code == 0 and doc["op_counts"] == {"Gemm": 2, "Relu": 1}
    assert doc["ir"].startswith("graph mlp(")

    artifact = tmp_path / "m.dnnc"
    code, out, err = dnnc_command("compile", mlp, "-o", artifact, "--json", "--target", "llvm",
                                  cwd=tmp_path)
    doc = json.loads(out)
    assert code == 0 and doc["output"] == str(artifact) and doc["target"] == "llvm"
    assert doc["kernels"] == dnnc.load(artifact).stats["kernels"] and doc["host_fallbacks"] == []
    assert doc["arena_bytes"] >= 0 and doc["compile_seconds"] > 0 and doc["emitted"] == {}

    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, _ = dnnc_command("run", artifact, "--input", f"input={tmp_path / 'x.npy'}",
                                "--json", cwd=tmp_path)
    doc = json.loads(out)
    want = dnnc.load(artifact)(x)
    (logits,) = doc["outputs"]
    assert code == 0 and doc["target"] == "llvm" and doc["seconds"] > 0
    assert logits["name"] == "logits" and logits["dtype"] == "float32"
    assert logits["shape"] == [2, 3] and logits["non_finite"] == 0
    np.testing.assert_allclose([logits["min"], logits["max"], logits["mean"]],
                               [want.min(), want.max(), want.mean()], rtol=1e-5)

    code, out, _ = dnnc_command("compare", mlp, "--json", "--bisect-passes", cwd=tmp_path)
    assert code == 0 and json.loads(out) == {"target": default_target(), "rtol": 1e-4,
                                             "atol": 1e-5, "divergence": False, "pass": None,
                                             "node": None}


def test_json_of_bench_and_tune(tmp_path, mlp):
    code, out, _ = dnnc_command("bench", mlp, "--repeat", "2", "--warmup", "0", "--json",
                                "--target", "llvm", cwd=tmp_path)
    doc = json.loads(out)
    assert code == 0 and doc["target"] == "llvm" and doc["repeat"] == 2 and doc["threads"] >= 1
    (row,) = doc["rows"]
    assert row["batch"] == 2 and row["dnnc_ms"] > 0
    if doc["onnxruntime"] is not None:
        assert row["ratio"] == pytest.approx(row["dnnc_ms"] / row["onnxruntime_ms"])

    log = tmp_path / "mlp.jsonl"
    code, out, _ = dnnc_command("tune", mlp, "--target", "llvm", "--log", log, "--trials", "2",
                                "--search", "random", "--json", "-q", cwd=tmp_path)
    doc = json.loads(out)
    assert code == 0 and doc["log"] == str(log) and doc["tasks"]
    assert sum(t["trials"] for t in doc["tasks"]) <= 2
    assert {"task", "key", "count", "default_ms", "best_ms", "speedup", "errors"} <= \
        set(doc["tasks"][0])


def test_a_failure_with_json_is_still_one_line_on_stderr(tmp_path):
    code, out, err = dnnc_command("inspect", tmp_path / "missing.onnx", "--json", cwd=tmp_path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("dnnc: error:")


def test_messages_go_through_the_dnnc_logger(mlp):
    """A compile asked for progress logs it at INFO on a child of the "dnnc" logger; an
    application that takes the logger over receives the records."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("dnnc")
    keep = Keep()
    logger.addHandler(keep)
    logger.removeHandler(dnnc.log.HANDLER)
    try:
        dnnc.compile(str(mlp), "llvm", progress=True)
        dnnc.compile(str(mlp), "llvm", progress=False)
    finally:
        logger.removeHandler(keep)
        logger.addHandler(dnnc.log.HANDLER)
    progress = [r for r in records if r.levelno == logging.INFO]
    assert len(progress) == 1 and progress[0].name.startswith("dnnc.")
    assert progress[0].getMessage().startswith("compiling segment 0: ")


# ---------------------------------------------------------------------------------------------
# docs/cli.md


def documented_flags() -> dict[str | None, set[str]]:
    """The flags docs/cli.md names (`--flag`, `-f`) in its text and in the command lines of
    its examples, per command: the one a line names (`dnnc compile m.onnx --tuning-log ...`),
    else the one whose section it is in; None for the flags of sections about no one command
    (the rules that apply to several)."""
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    found: dict[str | None, set[str]] = {}
    section, in_code = None, False
    for line in (REPO / "docs" / "cli.md").read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code and not re.match(r"(\$ )?dnnc |\s", line):
            continue   # an example's output, not a command line
        if line.startswith("## "):
            named = re.match(r"## `?dnnc (\w+)", line)
            section = named.group(1) if named else None
        named = [c for c in re.findall(r"\bdnnc (\w+)", line) if c in commands]
        command = named[0] if len(set(named)) == 1 else section
        line = re.sub(r"python -m|pip install -e", "", line)   # other commands' flags
        flags = re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", line)
        found.setdefault(command, set()).update(flags)
    return found


def test_every_flag_docs_cli_md_documents_exists():
    parsers = commands()
    documented = documented_flags()
    assert set(parsers) <= set(documented), "a command docs/cli.md does not describe"
    every = {"--version", "-h", "--help"}
    for parser in parsers.values():
        every |= {s for a in parser._actions for s in a.option_strings}
    for command, flags in documented.items():
        known = every if command is None else \
            {s for a in parsers[command]._actions for s in a.option_strings}
        assert flags <= known | {"--version"}, f"dnnc {command}: {sorted(flags - known)}"


def test_one_kernel_count_everywhere(tmp_path):
    """compile's line and JSON, its progress lines, `model.stats` after compile and after
    `dnnc.load`, and `inspect x.dnnc` give the same count: the fused kernels, not the nodes."""
    onnx_file, artifact = tmp_path / "cnn.onnx", tmp_path / "cnn.dnnc"
    assert dnnc_command("zoo", "cnn", "-o", onnx_file, "-q", cwd=tmp_path)[0] == 0
    code, out, err = dnnc_command("compile", onnx_file, "-o", artifact, "--target", "llvm",
                                  "--json", cwd=tmp_path)
    kernels = json.loads(out)["kernels"]
    progress = re.findall(r"^dnnc: compiling segment \d+: (\d+) kernel\(s\) of (\d+) node",
                          err, re.M)
    assert code == 0 and progress and sum(int(k) for k, _ in progress) == kernels
    assert kernels < sum(int(n) for _, n in progress)   # fusion: fewer kernels than nodes
    assert dnnc.compile(str(onnx_file), "llvm", progress=False).stats["kernels"] == kernels
    assert dnnc.load(artifact).stats["kernels"] == kernels
    code, out, _ = dnnc_command("inspect", artifact, "--json", cwd=tmp_path)
    assert code == 0 and json.loads(out)["artifact"]["kernels"] == kernels
    code, out, _ = dnnc_command("inspect", artifact, cwd=tmp_path)
    assert f", {kernels} kernels, " in out and "no estimate" not in out


def test_the_readme_commands_exist():
    """Each `dnnc COMMAND ...` line of the README's code blocks names a command and flags it
    has."""
    parsers = commands()
    lines, in_code = [], False
    for line in (REPO / "README.md").read_text().splitlines():
        in_code = in_code != line.startswith("```")
        if in_code and line.startswith("dnnc "):
            lines.append(line)
    assert len(lines) >= 5
    for line in lines:
        usage = line.split("#")[0]
        flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", usage))
        command = usage.split()[1]
        if command.startswith("-"):
            assert flags <= {"--version", "--help", "-h"}, line
            continue
        known = {s for a in parsers[command]._actions for s in a.option_strings}
        assert flags <= known, line


# ---------------------------------------------------------------------------------------------
# progress bars


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, recording what is drawn on it."""

    def isatty(self):
        return True


def visible_lines(drawn: str) -> list[str]:
    """What a terminal shows after `drawn`: each line as its last carriage return left it."""
    return [line.rsplit("\r", 1)[-1].rstrip() for line in drawn.split("\n")
            if line.rsplit("\r", 1)[-1].strip()]


def test_compile_draws_a_bar_on_a_terminal_and_erases_it(mlp, tmp_path, monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["compile", str(mlp), "-o", str(tmp_path / "m.dnnc"), "--target", "llvm"])
    drawn = terminal.getvalue()
    assert code == 0 and re.search(r"dnnc: +0%.*0/3 \[", drawn)   # 2 kernels, machine code
    assert "compiling segment 0: 2 kernel(s) of 3 node(s)" in drawn   # its postfix
    # erased: what stays are the message lines, not the bar
    assert not any("%" in line for line in visible_lines(drawn))
    assert "dnnc: compiling segment 0" not in "\n".join(visible_lines(drawn))
    terminal.seek(0)
    terminal.truncate()
    assert main(["compile", str(mlp), "-o", str(tmp_path / "m.dnnc"), "-q"]) == 0
    assert terminal.getvalue() == ""   # -q: no bar either


def test_a_compile_advances_kernel_by_kernel(monkeypatch):
    """Issue 30 item 15: a one-segment model sat at 0/49 for its whole compile, then jumped
    to the end: each kernel is a step now, as it is lowered and scheduled, and the segment's
    machine code the last."""
    from dnnc.backends import executable
    from dnnc.progress import Progress

    seen = []

    class Recording(Progress):
        def __init__(self, total, enabled, unit="step"):
            super().__init__(total, False, unit)
            seen.append(("total", total))
            self.count = 0

        def step(self, message, detail=False):
            seen.append((self.count, message))

        def done(self, n=1):
            self.count += n

        def close(self):
            seen.append(("closed", self.count))

    monkeypatch.setattr(executable, "Progress", Recording)
    model = dnnc.compile(zoo.build("cnn"), "llvm", cache=False, progress=True)
    kernels = model.stats["kernels"]
    assert kernels > 2 and seen[0] == ("total", kernels + 1) and seen[-1] == ("closed", kernels + 1)
    said = [(count, message) for count, message in seen[1:-1]
            if message.startswith("segment 0: kernel ")]
    assert len(said) == kernels   # each told as it is scheduled: the bar moves with it
    for k, (count, message) in enumerate(said):
        assert count == k and re.fullmatch(rf"segment 0: kernel {k + 1}/{kernels} "
                                           rf"\(k{k}_\w+\)", message), (count, message)
    assert (kernels, f"segment 0: machine code of {kernels} kernel(s) for "
            f"{REGISTRY['llvm'].target().cpu}") in seen


SUMMARY = re.compile(r"dnnc: compiled cnn for llvm: (\d+) kernels in \d+\.\d s")


def test_a_long_compile_ends_with_one_line_where_stderr_is_a_file(monkeypatch, capsys):
    """Issue 30 item 15: from Python with stderr a file nothing was shown of a long compile:
    one summary line now, also without progress asked for; none with `progress=False` or the
    `dnnc` logger above INFO."""
    from dnnc import progress

    monkeypatch.setattr(progress, "SUMMARY_SECONDS", 0.0)   # every compile is long
    capsys.readouterr()
    model = dnnc.compile(zoo.build("cnn"), "llvm", cache=False)
    (line,) = capsys.readouterr().err.splitlines()
    assert SUMMARY.fullmatch(line) and int(SUMMARY.fullmatch(line)[1]) == model.stats["kernels"]
    dnnc.compile(zoo.build("cnn"), "llvm", cache=False, progress=False)
    assert capsys.readouterr().err == ""
    level = dnnc.log.LOGGER.level
    dnnc.log.LOGGER.setLevel(logging.WARNING)
    try:
        dnnc.compile(zoo.build("cnn"), "llvm", cache=False)
    finally:
        dnnc.log.LOGGER.setLevel(level)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "SUMMARY_SECONDS", 1e9)   # a short compile says nothing
    dnnc.compile(zoo.build("cnn"), "llvm", cache=False)
    assert capsys.readouterr().err == ""


def test_the_summary_line_of_the_command_and_its_quiet(tmp_path, monkeypatch, capsys):
    """`dnnc compile` on a stderr that is no terminal ends a long compile with the summary
    line after its progress lines; `-q` prints neither."""
    from dnnc import progress

    monkeypatch.setattr(progress, "SUMMARY_SECONDS", 0.0)
    monkeypatch.setenv("DNNC_CACHE", "0")
    onnx_file = tmp_path / "cnn.onnx"
    import onnx
    onnx.save(zoo.build("cnn"), onnx_file)
    capsys.readouterr()
    assert main(["compile", str(onnx_file), "-o", str(tmp_path / "m.dnnc"), "--target",
                 "llvm"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("dnnc: compiling segment 0: ") for line in lines), lines
    assert sum(bool(SUMMARY.fullmatch(line)) for line in lines) == 1, lines
    assert main(["compile", str(onnx_file), "-o", str(tmp_path / "m.dnnc"), "--target",
                 "llvm", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_bisect_draws_a_bar_and_ctrl_c_leaves_one_line(mlp, monkeypatch, capsys):
    """A Ctrl-C during the bisection's third compile ends with `dnnc: interrupted` alone on
    the screen: the bar is erased first."""
    from dnnc.compiler import compare

    real, calls = compare.compile, []

    def compile_until_interrupted(*args, **kwargs):
        calls.append(kwargs.get("passes"))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(compare, "compile", compile_until_interrupted)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["compare", str(mlp), "--bisect-passes", "--target", "llvm"])
    drawn = terminal.getvalue()
    assert code == 130 and calls == [0, 1, 2]
    # (fuse_quantized first, then fold_constants)
    assert re.search(r"\| 3/16 \[.*compiling after 2 pass\(es\): fold_constants", drawn), drawn
    assert visible_lines(drawn) == ["dnnc: interrupted"]


# ---------------------------------------------------------------------------------------------
# pictures and traces


def test_bench_profile_writes_a_chrome_trace_of_the_kernels(tmp_path, mlp):
    """The trace holds one complete event per kernel, in call order, end to end, named and
    described as the kernels `CompiledModel.profile` times (what Perfetto shows)."""
    trace = tmp_path / "prof.json"
    code, out, _ = dnnc_command("bench", mlp, "--target", "llvm", "--repeat", "3",
                                "--warmup", "1", "--no-onnxruntime", "--profile", "--trace",
                                trace, "--json", cwd=tmp_path)
    assert code == 0
    (row,) = json.loads(out)["rows"]
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    meta = {(e["name"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0)] == f"dnnc llvm: {mlp}"
    assert meta[("thread_name", 1)] == "batch 2"
    kernels = [e for e in events if e["ph"] == "X"]
    model = dnnc.compile(str(mlp), "llvm", progress=False)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    want = model.profile(x, repeat=1)
    assert len(kernels) == len(want) == model.stats["kernels"]
    assert [e["name"] for e in kernels] == [w["kernel"] for w in want]
    assert [e["args"]["nodes"] for e in kernels] == [w["nodes"] for w in want]
    assert [e["name"] for e in kernels] == [r["kernel"] for r in row["profile"]]
    assert all(e["cat"] == "kernel" and e["tid"] == 1 and e["dur"] > 0 for e in kernels)
    assert kernels[0]["ts"] == 0
    for a, b in zip(kernels, kernels[1:]):   # end to end, in call order
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=0.002)
    assert sum(e["args"]["share"] for e in kernels) == pytest.approx(1, abs=0.01)
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["target"] == "llvm"
    # percentiles and throughput of the calls; each kernel's template, knobs, work
    assert row["dnnc_ms"] <= row["dnnc_p90_ms"] <= row["dnnc_p99_ms"]
    assert row["throughput_per_s"] == pytest.approx(2 * 1e3 / row["dnnc_ms"])
    first = row["profile"][0]
    assert first["template"] == "dense" and set(first["config"]) == {"mr", "nr", "kc",
                                                                     "mc_tiles", "prefetch"}
    assert first["flops"] >= 2 * 2 * 8 * 16   # a multiply and an add per product term
    assert first["bytes"] >= (2 * 8 + 8 * 16 + 2 * 16) * 4

    code, out, _ = dnnc_command("bench", mlp, "--target", "llvm", "--repeat", "2", "--profile",
                                "--no-onnxruntime", cwd=tmp_path)
    assert code == 0 and re.search(r"^profile, batch 2: 2 kernels, each called alone", out,
                                   re.M)
    assert re.search(r"^ +[\d.]+ +[\d.]+% +[\d.]+ +[\d.]+  k\d_MatMulPacked \(fc_0, relu_0\) "
                     r"dense \{mr=\d+, nr=\d+, kc=\d+, mc_tiles=\d+, prefetch=(True|False)\}$",
                     out, re.M)
    assert re.search(r"^ +batch +dnnc ms +p90 +p99 +items/s", out, re.M)


@pytest.mark.parametrize("argv,message", [
    (["bench", "ARTIFACT", "--profile"], "--profile: an artifact keeps no kernel list"),
    (["bench", "MLP", "--target", "numpy", "--trace", "t.json"],
     "--trace: the numpy target runs no kernels"),
    (["bench", "MLP", "--trace", "no/such/dir/t.json"], "folder 'no/such/dir' does not exist"),
    (["inspect", "MLP", "--profile"], "--profile goes with --draw"),
    (["inspect", "ARTIFACT", "--draw", "g.svg", "--profile"], "an artifact keeps no kernel"),
    (["inspect", "MLP", "--target", "llvm"], "go with --passes or --draw"),
])
def test_profile_and_draw_mistakes(tmp_path, mlp, capsys, argv, message):
    artifact = tmp_path / "m.dnnc"
    dnnc.compile(str(mlp), "llvm", progress=False).save(artifact)
    argv = [{"MLP": str(mlp), "ARTIFACT": str(artifact)}.get(a, a) for a in argv]
    code, out, err = dnnc_command(*argv, cwd=tmp_path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and message in err, err


def kernel_boxes(svg: str) -> dict[str, list[str]]:
    """The plain SVG's boxes: id -> their lines of text."""
    import xml.etree.ElementTree as ET

    ns = {"svg": "http://www.w3.org/2000/svg"}
    root = ET.fromstring(svg)
    return {g.get("id"): [t.text for t in g.findall("svg:text", ns)]
            for g in root.findall("svg:g", ns)}


def test_inspect_draws_the_optimised_graph_by_kernel(tmp_path):
    from dnnc.compiler.draw import has_graphviz

    if has_graphviz():
        pytest.skip("graphviz draws here; test_graphviz_draws_clusters covers it")
    onnx_file = tmp_path / "cnn.onnx"
    assert dnnc_command("zoo", "cnn", "-o", onnx_file, "-q", cwd=tmp_path)[0] == 0
    model = dnnc.compile(str(onnx_file), "llvm", progress=False)
    groups = [[n.name for n in g] for g in model.graph.groups]
    code, out, err = dnnc_command("inspect", onnx_file, "--draw", tmp_path / "g.svg",
                                  "--target", "llvm", "--json", cwd=tmp_path)
    assert code == 0 and json.loads(out)["draw"] == {
        "file": str(tmp_path / "g.svg"), "renderer": "plain", "kernels": len(groups),
        "nodes": len(model.graph.nodes), "profiled": False}
    boxes = kernel_boxes((tmp_path / "g.svg").read_text())
    assert boxes.pop("kernel-1") == ["inputs", "input: float32[1,3,32,32]"]
    assert [[line.split()[1] for line in lines[1:]] for lines in boxes.values()] == groups

    code, out, _ = dnnc_command("inspect", onnx_file, "--draw", tmp_path / "p.svg",
                                "--profile", "--target", "llvm", "-q", cwd=tmp_path)
    svg = (tmp_path / "p.svg").read_text()
    titles = [lines[0] for k, lines in kernel_boxes(svg).items() if k != "kernel-1"]
    shares = [float(t.split(", ")[1].rstrip("%")) for t in titles]
    assert code == 0 and len(shares) == len(groups) and sum(shares) == pytest.approx(100, abs=1)
    assert 'fill="#ff0000"' in svg   # the slowest kernel, fully red

    artifact = tmp_path / "cnn.dnnc"
    model.save(artifact)
    code, out, _ = dnnc_command("inspect", artifact, "--draw", tmp_path / "a.svg", "--json",
                                cwd=tmp_path)
    assert code == 0 and json.loads(out)["draw"]["kernels"] == model.stats["kernels"]
    assert kernel_boxes((tmp_path / "a.svg").read_text()) == kernel_boxes(
        (tmp_path / "g.svg").read_text())   # the artifact's graph is the one compile made

    code, _, _ = dnnc_command("inspect", onnx_file, "--draw", tmp_path / "n.svg", "--target",
                              "numpy", cwd=tmp_path)
    assert code == 0 and len(kernel_boxes((tmp_path / "n.svg").read_text())) - 1 == \
        len(import_onnx(onnx_file).nodes)   # the reference: a node, a kernel


def test_graphviz_draws_clusters(tmp_path, mlp):
    from dnnc.compiler.draw import has_graphviz, render_graphviz

    if not has_graphviz():
        pytest.skip("graphviz's Python package or its dot program is not installed")
    graph = dnnc.compile(str(mlp), "llvm", progress=False).graph
    svg = render_graphviz(graph)
    assert svg.count('class="cluster"') == len(graph.groups)


def test_a_message_during_a_bar_gets_a_line_of_its_own(monkeypatch):
    """-v's debug lines while a compile's bar is drawn: the bar is lifted off its line, the
    message written, the bar drawn again below it."""
    from dnnc.progress import Progress

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with Progress(2, True) as bar:
        bar.step("first")
        logging.getLogger("dnnc.test").warning("a message")
        bar.done()
    lines = terminal.getvalue().split("\n")
    (said,) = [line for line in lines if "a message" in line]
    assert said.rsplit("\r", 1)[-1] == "dnnc: a message"
    assert visible_lines(terminal.getvalue()) == ["dnnc: a message"]   # the bar erased


def test_a_bar_is_redrawn_during_a_long_step(monkeypatch):
    """Elapsed time moves while one step runs long (LLVM on a big segment): a thread redraws
    the bar, and stops when it is closed."""
    import threading
    import time

    from dnnc import progress

    monkeypatch.setattr(progress, "REDRAW_SECONDS", 0.05)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    before = set(threading.enumerate())   # other tests' threads may end meanwhile
    with progress.Progress(1, True) as bar:
        bar.step("one long step")
        drawn = terminal.getvalue().count("\r")
        time.sleep(0.5)
        assert terminal.getvalue().count("\r") >= drawn + 3
    time.sleep(0.2)
    # tqdm's own monitor starts with the first bar of the process and stays (an earlier
    # test's bar in this worker may have started it): not a thread of dnnc's
    left = {t for t in threading.enumerate() if t.name != "tqdm_monitor"}
    assert left <= before


def test_tune_log_warnings_print_as_one_dnnc_line_each(tmp_path, mlp):
    """Issue 30: a tuning log's warnings printed as Python's (a source path, the category,
    the `warnings.warn` line under it) and a hostile line ended the command with status 3;
    each is now one `dnnc: warning: ...` line, shown under -q, and the compile succeeds."""
    log = tmp_path / "log.jsonl"
    good = json.dumps({"task": "t1", "template": "dense", "target": "llvm:other-cpu:+a",
                       "config": {"mr": 4}, "ms": 0.5})
    log.write_text("{not json\n" + good.replace('"ms": 0.5', '"ms": 1' + "0" * 400) + "\n"
                   + good + "\n")
    code, out, err = dnnc_command("compile", mlp, "--target", "llvm", "-o",
                                  tmp_path / "m.dnnc", "--tuning-log", log, "-q", cwd=tmp_path)
    assert code == 0, err
    cpu = REGISTRY["llvm"].target().cpu
    assert err.splitlines() == [
        f"dnnc: warning: {log}:1: skipped (not JSON: Expecting property name enclosed in "
        f"double quotes)",
        f"dnnc: warning: {log}:2: skipped (unreadable: OverflowError: int too large to "
        f"convert to float)",
        f"dnnc: warning: tuning log {log}: no record for this machine (llvm:{cpu}, its "
        f"features and precision): every kernel keeps its default config"], err


def test_the_profile_shows_each_kernel_s_share_of_the_gpu_roofline():
    """Issue 31, item 1: `bench --profile` on cuda prints each kernel's share of the card's
    roofline (its FLOPs at the SIMT or tensor-core rate of the precision, its bytes at the
    copy bandwidth, whichever is slower, over its measured time); CPU targets print none."""
    from dnnc.compiler.cli.bench import _format_profile, roofline
    from dnnc.ir.target import GPU, Target

    card = GPU("NVIDIA H100 80GB HBM3", 132, 50e12, 400e12, 3e12)
    fp16 = Target("cuda", gpu=card, precision="fp16")
    row = {"kernel": "k0_MatMul", "nodes": ["mm"], "config": {}}
    gemm = {**row, "ms": 1.0, "flops": 400e9, "bytes": 1e6, "template": "cuda_mma_dense"}
    simt = {**row, "ms": 1.0, "flops": 25e9, "bytes": 1e6, "template": "cuda_dense"}
    copy = {**row, "ms": 2.0, "flops": None, "bytes": 3e9, "template": "cuda_rows"}
    assert roofline(gemm, fp16) == pytest.approx(0.5)      # 400 GFLOP at 800 TFLOP/s (fp16)
    assert roofline(gemm, Target("cuda", gpu=card, precision="tf32")) == pytest.approx(1.0)
    assert roofline(simt, fp16) == pytest.approx(0.5)      # SIMT: 50 TFLOP/s whatever the
    assert roofline(copy, fp16) == pytest.approx(0.5)      # precision; 3 GB at 3 TB/s in 2 ms
    assert roofline({**row, "ms": 1.0, "flops": None, "bytes": 0}, fp16) is None
    assert roofline(gemm, Target("llvm")) is None
    text = _format_profile("batch 1", [gemm, copy], 20, fp16)
    assert "roof" in text.splitlines()[1] and text.count(" 50.0%") == 2
    assert "NVIDIA H100 80GB HBM3's roofline" in text.splitlines()[0]
    assert "roof" not in _format_profile("batch 1", [gemm], 20, Target("llvm"))
