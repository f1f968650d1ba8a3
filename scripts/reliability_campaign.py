"""Bounded fault campaigns behind docs/reliability.md: damage real files, kill real processes,
count what happens. Prints one markdown row per campaign.

    python scripts/reliability_campaign.py [--quick] [--seed S]

Campaigns (each seeded, so a row can be reproduced):

* ``checkpoint``: a real 2-step tiny-model run; then, many times, one random damage of one random
  file of the newest checkpoint (a byte flip, a truncation, a deletion, NaN weights written with
  a consistent manifest); counted: damage found by ``verify_checkpoint`` and the fall-back
  ``latest_good_checkpoint`` choosing the previous checkpoint.
* ``traces``: random byte edits of valid trace lines (flip, delete, insert, duplicate a field,
  a numeric string, a huge integer, deep nesting); counted: lines read as episodes, lines
  rejected with a ``file:line`` TraceError, anything else (a crash).
* ``tasks``: random edits of a task line (the trace edits, plus integers of 101-20,000 digits), read by
  ``load_tasks``;
* ``wf``: random edits of the example ``.wf`` files, checked in a subprocess under a timeout;
  counted: accepted, rejected with the project's errors, crashes, hangs, formatter round trips
  that changed the meaning.
* ``kill9``: a real ``srpo-graph train`` killed with SIGKILL at a random moment, then resumed;
  counted: resumes that finished with a checkpoint that verifies.

Nothing here is a test (tests/ holds those); this is the longer run the table reports.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
SMALL = ["rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0", "checkpoint.every=1",
         "checkpoint.keep_last=3", "logging.tensorboard=false", "logging.plots=false", "logging.progress=false",
         "logging.traces_every=0", "compile.micro_batch_tokens=64"]


def _train(run: Path, steps: int, resume: bool = False) -> subprocess.Popen:
    args = ["srpo-graph", "train", "workflows/coord_seq.wf", "--steps", str(steps)]
    args += ["--resume", str(run)] if resume else ["--run-dir", str(run), *SMALL]
    return subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def checkpoint_campaign(rng: random.Random, n: int, tmp: Path) -> str:
    import torch
    from safetensors.torch import load_file, save_file

    from srpo_graph.train import checkpoint as ck
    from srpo_graph.train.checkpoint import layout

    base = tmp / "base"
    proc = _train(base, 2)
    assert proc.wait(timeout=600) == 0, proc.communicate()
    found = fell_back = crashes = 0
    kinds: dict[str, int] = {}
    for _ in range(n):
        run = tmp / "ck"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(base, run)
        newest = run / "checkpoints" / "step_2"
        files = sorted(p for p in newest.rglob("*") if p.is_file())
        target = rng.choice(files)
        kind = rng.choice(["flip", "truncate", "delete", "nan"])
        if kind == "nan":
            target = ck.policy_path(newest, "tiny") / "model.safetensors"
            tensors = load_file(target)
            name = rng.choice(sorted(tensors))
            tensors[name] = tensors[name].clone().view(-1).index_fill_(0, torch.tensor([0]), float("nan")).view(
                tensors[name].shape)
            save_file(tensors, target, metadata={"format": "pt"})
            marker = json.loads((newest / ck.COMPLETE).read_text())
            marker["files"] = layout.manifest(newest)
            (newest / ck.COMPLETE).write_text(json.dumps(marker))
        elif kind == "delete":
            target.unlink()
        else:
            data = bytearray(target.read_bytes())
            if kind == "flip" and data:
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
            else:
                data = data[: rng.randrange(max(1, len(data)))]
            target.write_bytes(bytes(data))
        kinds[kind] = kinds.get(kind, 0) + 1
        try:
            if ck.verify_checkpoint(newest) is not None:
                found += 1
            good, _ = ck.latest_good_checkpoint(run)
            fell_back += good == run / "checkpoints" / "step_1"
        except Exception:  # noqa: BLE001 - what the campaign counts
            crashes += 1
    detail = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    return (f"| damaged newest checkpoint ({detail}) | {n} | damage found {found}/{n}; `--resume` falls back to "
            f"the previous good checkpoint {fell_back}/{n}; exceptions {crashes} |")


def _mutate_trace(rng: random.Random, line: str) -> bytes:
    data = json.loads(line)
    op = rng.choice(["flip", "delete", "insert", "numeric_string", "huge_int", "deep", "nan", "binary"])
    if op == "numeric_string":
        data["reward"] = str(data["reward"])
    elif op == "huge_int":
        data["outputs"][0]["completion_ids"][0] = rng.choice([2**63, 2**64 + 7, -(2**63) - 1, 10**30])
    elif op == "deep":  # spliced in as text: json.dumps itself cannot write such depth
        depth = rng.choice([70, 5000, 100_000])
        data["outputs"][0]["value"] = "@DEEP@"
        return json.dumps(data).replace('"@DEEP@"', "[" * depth + "1" + "]" * depth).encode()
    elif op == "nan":
        data["reward"] = rng.choice([float("nan"), float("inf"), 1e300])
    raw = json.dumps(data).encode()
    if op in ("flip", "delete", "insert", "binary"):
        buf = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(buf))
            if op == "delete":
                del buf[i]
            elif op == "insert":
                buf.insert(i, rng.choice(b'{}[]":,0123456789-.eE \\\xff\xc3'))
            elif op == "binary":
                buf[i] = rng.randrange(128, 256)
            else:
                buf[i] ^= 1 << rng.randrange(7)
        raw = bytes(buf).replace(b"\n", b" ")
    return raw


def traces_campaign(rng: random.Random, n: int, tmp: Path) -> str:
    from srpo_graph.compiler.synthetic import synthetic_episodes
    from srpo_graph.errors import TraceError
    from srpo_graph.runtime.trace import read_traces

    good = [ep.to_json() for ep in synthetic_episodes(4, 4, seed=1)]
    ok = rejected = crashes = 0
    path = tmp / "t.jsonl"
    for _ in range(n):
        path.write_bytes(_mutate_trace(rng, rng.choice(good)) + b"\n")
        try:
            read_traces(path)
            ok += 1
        except TraceError as exc:
            rejected += str(exc).startswith(f"{path}:1")
        except Exception:  # noqa: BLE001 - what the campaign counts
            crashes += 1
    return (f"| corrupted trace lines (bit flips, bytes deleted/inserted, binary, numeric strings, ids >= 2^63, "
            f"nesting to 100,000, NaN/inf/1e300 rewards) | {n} | read as episodes {ok}; rejected with `file:line` "
            f"{rejected}; crashes {crashes} |")


def _mutate_task(rng: random.Random, target: int) -> bytes:
    op = rng.choice(["flip", "delete", "insert", "binary", "huge_int", "deep", "nan", "string"])
    data: dict = {"id": f"t{target}", "target": target}
    if op == "huge_int":
        data["target"] = "@INT@"
        digits = rng.choice([101, 4301, 20_000])
        return json.dumps(data).replace('"@INT@"', "7" * digits).encode()
    if op == "deep":
        depth = rng.choice([65, 5000, 100_000])
        data["extra"] = "@DEEP@"
        return json.dumps(data).replace('"@DEEP@"', "[" * depth + "1" + "]" * depth).encode()
    if op == "nan":
        data["target"] = rng.choice([float("nan"), float("inf"), 1e300])
    if op == "string":
        data["target"] = str(target)
    raw = bytearray(json.dumps(data).encode())
    if op in ("flip", "delete", "insert", "binary"):
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(raw))
            if op == "delete":
                del raw[i]
            elif op == "insert":
                raw.insert(i, rng.choice(b'{}[]":,0123456789-.eE \\\xff\xc3'))
            elif op == "binary":
                raw[i] = rng.randrange(128, 256)
            else:
                raw[i] ^= 1 << rng.randrange(7)
    return bytes(raw).replace(b"\n", b" ")


def tasks_campaign(rng: random.Random, n: int, tmp: Path) -> str:
    """Damaged task lines (issue 23, item 5) through ``load_tasks`` (the one JSONL reader)."""
    from srpo_graph.errors import SrpoGraphError
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.tasks import load_tasks

    wf = load_workflow(ROOT / "workflows" / "coord_seq.wf")
    ok = rejected = crashes = 0
    path = tmp / "tasks.jsonl"
    for _ in range(n):
        path.write_bytes(b'{"id": "first", "target": 1}\n' + _mutate_task(rng, rng.randrange(10)) + b"\n")
        try:
            load_tasks(path, wf)
            ok += 1
        except SrpoGraphError as exc:
            rejected += str(exc).startswith(f"{path}:2")
        except Exception:  # noqa: BLE001 - what the campaign counts
            crashes += 1
    return (f"| damaged task lines (bit flips, bytes deleted/inserted, binary, integers of 101 to 20,000 digits, "
            f"nesting to 100,000, NaN/inf, numeric strings) after a good line | {n} | read as tasks {ok}; rejected "
            f"naming `file:2` {rejected}; crashes {crashes} |")


_WF_WORKER = r"""
import json, sys
from srpo_graph.errors import SrpoGraphError
from srpo_graph.lang import check, format_source, parse
root = sys.argv[1]
def strip(v):  # what running the workflow depends on: everything but spans and the source hash
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if k not in ("span", "source_hash", "path")}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
out = {"ok": 0, "rejected": 0, "crash": 0, "fmt_changed": 0}
for line in sys.stdin:
    text = json.loads(line)
    try:
        wf = check(parse(text, "m.wf"), text, base_dir=root)
    except SrpoGraphError:
        out["rejected"] += 1
        continue
    except BaseException as exc:
        out["crash"] += 1
        print(repr(exc)[:200], file=sys.stderr)
        continue
    out["ok"] += 1
    try:
        again = format_source(text)
        wf2 = check(parse(again, "m.wf"), again, base_dir=root)
        if strip(wf2.model_dump(mode="json")) != strip(wf.model_dump(mode="json")):
            out["fmt_changed"] += 1
    except BaseException as exc:
        out["fmt_changed"] += 1
        print("fmt:", repr(exc)[:200], file=sys.stderr)
print(json.dumps(out))
"""


def wf_campaign(rng: random.Random, n: int, tmp: Path) -> str:
    sources = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "workflows").glob("*.wf"))]
    alphabet = list('{}[]()":,.?=->#\\\n\r\t x1e0_')
    alphabet += ["route", "end", "true", "\u2028", "\ufeff", '"""', "1e999", "0x4"]
    lines = []
    for _ in range(n):
        text = rng.choice(sources)
        for _ in range(rng.randint(1, 5)):
            i = rng.randrange(max(1, len(text)))
            op = rng.choice(["delete", "insert", "swap", "dup_line"])
            if op == "delete":
                text = text[:i] + text[i + rng.randint(1, 8) :]
            elif op == "insert":
                text = text[:i] + rng.choice(alphabet) + text[i:]
            elif op == "swap" and i + 1 < len(text):
                text = text[:i] + text[i + 1] + text[i] + text[i + 2 :]
            else:
                ls = text.split("\n")
                j = rng.randrange(len(ls))
                ls.insert(j, ls[j])
                text = "\n".join(ls)
        lines.append(json.dumps(text))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _WF_WORKER, str(ROOT / "workflows")],
            input="\n".join(lines),
            capture_output=True,
            text=True,
            env=ENV,
            timeout=max(120, n // 10),
        )
        counts = json.loads(proc.stdout.splitlines()[-1])
        hang = 0
    except subprocess.TimeoutExpired:
        counts, hang = {"ok": "?", "rejected": "?", "crash": "?", "fmt_changed": "?"}, 1
    took = time.monotonic() - t0
    return (
        f"| mutated example `.wf` files (deletions, insertions incl. `\\r`, U+2028, BOM, `1e999`, `0x4`, "
        f"keywords; swaps; duplicated lines) | {n} | accepted {counts['ok']}; rejected with the project's errors "
        f"{counts['rejected']}; crashes {counts['crash']}; hangs {hang} ({took:.0f} s in all); `fmt` changed the "
        f"meaning of an accepted file {counts['fmt_changed']} |"
    )


def kill9_campaign(rng: random.Random, n: int, tmp: Path) -> str:
    from srpo_graph.train import checkpoint as ck
    from srpo_graph.train.observe.metrics import read_metrics

    resumed = 0
    for k in range(n):
        run = tmp / f"k{k}"
        proc = _train(run, 6)
        want = rng.randint(1, 4)
        deadline = time.monotonic() + 600
        while len(read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []) < want:
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        time.sleep(rng.random() * 0.5)  # anywhere in the step: rollout, update, checkpoint write
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        again = _train(run, 6, resume=True)
        out, err = again.communicate(timeout=600)
        good, damaged = ck.latest_good_checkpoint(run)
        if again.returncode == 0 and good is not None and good.name == "step_6" and not damaged:
            resumed += 1
        elif again.returncode != 0:
            print(err[-1500:], file=sys.stderr)
    return (
        f"| `kill -9` of `srpo-graph train` at a random moment, then `--resume` | {n} | resumed to the end with a "
        f"verified checkpoint {resumed}/{n} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="checkpoint,traces,tasks,wf,kill9")
    args = ap.parse_args()
    counts = (
        {"checkpoint": 10, "traces": 200, "tasks": 200, "wf": 200, "kill9": 1}
        if args.quick
        else {"checkpoint": 100, "traces": 5000, "tasks": 5000, "wf": 10000, "kill9": 8}
    )
    rng = random.Random(args.seed)
    print("| what was tried | times | what happened |\n|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="srpo-graph-faults-") as d:
        for name in args.only.split(","):
            row = globals()[f"{name}_campaign"](rng, counts[name], Path(d))
            print(row, flush=True)


if __name__ == "__main__":
    main()
