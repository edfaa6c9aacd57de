#!/usr/bin/env python3
"""Fidelity table (issue 10, docs/fidelity.md): real Megatron-LM runs on W GPUs against prism-run with one or two
real ranks. Reads the run directories that tests/gpu/fidelity_suite.sh writes and prints one row per
(configuration, prism ranks): native ms, prism ms, error %, native MiB, prism MiB, error %, then the mean and max
|error| against the targets. Python 3 standard library only.

  fidelity_table.py ROOT_OR_CONFIG_DIR... [--tsv F] [--md F] [--detail F] [--targets] [--skip N]
      the table; with --targets exit 0 only when every row has its numbers and the targets are met
  fidelity_table.py --check CONFIG_DIR [--detail F]
      exit 0 when every run of that configuration that was started finished (exit 0) and its numbers parsed
  fidelity_table.py --write-hook DIR     write the measurement hook (DIR/sitecustomize.py) the suite puts on PYTHONPATH
  fidelity_table.py --self-test          the parser against synthetic logs in Megatron's exact format

Layout of a configuration directory (written by the suite):
  config.txt                   key=value: name, world, tp, pp, ep, dp, gbs, iters, skip
  native/                      meta.txt (rc, wall_s, or skipped=why), cmd.txt, out.log (every rank's output)
  prism_r<R>/, prism_r0-1/     meta.txt (ranks, payload, rc, wall_s, or skipped=why), cmd.txt, out.log,
                               and what prism-run writes there: report.json, logs/rank<R>.log
  collect/                     the `prism-run collect` run whose payloads a rank R with tensor-parallel rank != 0 replays

What is compared (docs/fidelity.md, "How errors are computed"):
  time    native: Megatron's "elapsed time per iteration (ms)" (printed by the last rank), median over iterations
          skip+1..N. prism: report.json per-rank iteration_times_s (element k is iteration k+1), per iteration the
          slowest real rank, median over the same iterations. error % = (prism - native) / native x 100.
  memory  per real rank R: native torch.cuda.max_memory_allocated() of rank R (the hook's line at exit) against
          prism's report ranks[].torch_max_allocated_bytes (the largest value prism's hook saw at the optimizer
          steps); a row's error is the real rank with the largest |error|. Cross-checks kept in the TSV: Megatron's
          "[Rank R] (after K iterations) memory (MB) | ... max allocated: X" on both sides, and the hook under prism.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile

TIME_MEAN_TARGET = 1.0   # percent, mean |iteration-time error|
TIME_MAX_TARGET = 2.0    # percent, max |iteration-time error|
MEM_MAX_TARGET = 0.01    # percent, max |peak allocated memory error|
MIB = 1024.0 * 1024.0

# Megatron-LM, megatron/training/training.py training_log(): ' iteration {:8d}/{:8d} |' ... ' elapsed time per
# iteration (ms): {:.1f} |'  (printed by the last rank, print_rank_last).
ITER_RE = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")
# megatron/training/utils/common_utils.py report_memory(): "[Rank {}] {}" with
# "(after N iterations) memory (MB) | allocated: {:.2f} | max allocated: {:.2f} | ..." (data-parallel rank 0 only).
MEM_RE = re.compile(r"\[Rank (\d+)\] \(([^)]*)\) memory \(MB\) \| allocated: ([0-9.]+) \| max allocated: ([0-9.]+)")
# The hook below, at exit of every rank that initialised CUDA.
HOOK_RE = re.compile(r"PRISM_FIDELITY_MEM rank=(-?\d+) .*?max_allocated_bytes=(\d+)")

HOOK_SOURCE = r'''"""Prism fidelity hook (written by tests/gpu/fidelity_table.py --write-hook; docs/fidelity.md).

Loaded as `sitecustomize` from PYTHONPATH in the native runs; under prism-run, prism's own sitecustomize comes first
on the path and chains this one. At exit, a rank that initialised CUDA prints one line:
  PRISM_FIDELITY_MEM rank=R max_allocated_bytes=N max_reserved_bytes=N allocated_bytes=N
(torch.cuda.max_memory_allocated() etc. of its current device, exact bytes). It never imports torch itself, never
touches the job's import of torch, and never fails the job.
"""
import atexit
import os
import sys


def _prism_fidelity_report():
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if not torch.cuda.is_initialized():
            return
        line = "PRISM_FIDELITY_MEM rank=%s max_allocated_bytes=%d max_reserved_bytes=%d allocated_bytes=%d" % (
            os.environ.get("RANK", "-1"), torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
            torch.cuda.memory_allocated())
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except Exception as e:  # a measurement must never break the job
        sys.stderr.write("[fidelity hook] no memory line: %r\n" % (e,))


def _prism_fidelity_chain():
    """Python imports only the first sitecustomize on sys.path: run the next one after this directory, if any."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.abspath(p or ".") for p in sys.path]
    # Why only the entries after this one: an earlier sitecustomize (prism's) is the one that chained us.
    rest = sys.path[paths.index(here) + 1:] if here in paths else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_prism_fidelity_next_sitecustomize"] = module
    spec.loader.exec_module(module)


atexit.register(_prism_fidelity_report)
try:
    _prism_fidelity_chain()
except Exception as _e:
    sys.stderr.write("[fidelity hook] the next sitecustomize failed: %r\n" % (_e,))
'''


# ----------------------------------------------------------------------------------------------------------- reading

def read_kv(path):
    out = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if "=" in line:
                    k, v = line.split("=", 1)
                    out[k.strip()] = v
    except OSError:
        pass
    return out


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def megatron_iter_ms(text):
    """{iteration: ms} from Megatron's iteration lines (the last line per iteration wins)."""
    out = {}
    for m in ITER_RE.finditer(text):
        out[int(m.group(1))] = float(m.group(3))
    return out


def megatron_mem_mb(text):
    """{rank: largest 'max allocated' MB} from Megatron's report_memory lines."""
    out = {}
    for m in MEM_RE.finditer(text):
        r, v = int(m.group(1)), float(m.group(4))
        out[r] = max(out.get(r, 0.0), v)
    return out


def hook_mem_bytes(text):
    """{rank: max_allocated_bytes} from the hook's exit lines (largest per rank: forked helpers may print too)."""
    out = {}
    for m in HOOK_RE.finditer(text):
        r, v = int(m.group(1)), int(m.group(2))
        out[r] = max(out.get(r, 0), v)
    return out


def median_after(values_by_iter, skip):
    vals = [v for it, v in sorted(values_by_iter.items()) if it > skip and v is not None]
    return (statistics.median(vals), len(vals)) if vals else (None, 0)


def pct(a, b):
    """(b - a) / a in percent; None when either is missing or a is 0."""
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a * 100.0


def parse_ranks(s):
    out = []
    for part in str(s).split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


class Run:
    """One run directory: native/ or prism_*/ or collect/."""

    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path.rstrip("/"))
        self.meta = read_kv(os.path.join(path, "meta.txt"))
        self.cmd = read_text(os.path.join(path, "cmd.txt")).strip()
        self.skipped = self.meta.get("skipped")
        self.rc = int(self.meta["rc"]) if self.meta.get("rc", "").lstrip("-").isdigit() else None
        self.ranks = parse_ranks(self.meta.get("ranks", ""))
        self.report = None
        text = read_text(os.path.join(path, "out.log"))
        logs = os.path.join(path, "logs")
        if os.path.isdir(logs):
            for n in sorted(os.listdir(logs)):
                if n.endswith(".log"):
                    text += "\n" + read_text(os.path.join(logs, n))
        self.text = text
        rep = os.path.join(path, "report.json")
        if os.path.isfile(rep):
            try:
                with open(rep) as f:
                    self.report = json.load(f)
            except (OSError, ValueError):
                self.report = None

    def problem(self):
        """Why this run does not count, or None."""
        if self.skipped is not None:
            return None
        if not self.meta:
            return "no meta.txt (not run?)"
        if self.rc is None:
            return "no exit status (still running or killed?)"
        if self.rc != 0:
            return "exit %d%s" % (self.rc, " (timeout)" if self.rc in (124, 137) else "")
        return None


class Config:
    def __init__(self, path, skip=None):
        self.path = path
        self.cfg = read_kv(os.path.join(path, "config.txt"))
        self.name = self.cfg.get("name", os.path.basename(path.rstrip("/")))
        self.world = int(self.cfg.get("world", "0") or 0)
        self.model_args = read_text(os.path.join(os.path.dirname(os.path.abspath(path)), "model_args.txt")).strip()
        self.skip = int(skip if skip is not None else self.cfg.get("skip", "10") or 10)
        self.native = Run(os.path.join(path, "native")) if os.path.isdir(os.path.join(path, "native")) else None
        self.prism = []
        self.others = []
        for n in sorted(os.listdir(path)):
            p = os.path.join(path, n)
            if not os.path.isdir(p):
                continue
            if n.startswith("prism_"):
                self.prism.append(Run(p))
            elif n not in ("native",):
                self.others.append(Run(p))
        self.prism.sort(key=lambda r: (len(r.ranks), r.ranks))

    def native_numbers(self):
        """(median ms, iterations used, {rank: hook bytes}, {rank: megatron MB}, problem)."""
        n = self.native
        if n is None:
            return None, 0, {}, {}, "no native run directory"
        if n.skipped is not None:
            return None, 0, {}, {}, "skipped: " + n.skipped
        prob = n.problem()
        ms, count = median_after(megatron_iter_ms(n.text), self.skip)
        hook = hook_mem_bytes(n.text)
        mega = megatron_mem_mb(n.text)
        if prob is None and ms is None:
            prob = "no 'elapsed time per iteration' lines after iteration %d" % self.skip
        missing = [r for r in range(self.world) if r not in hook]
        if prob is None and missing:
            prob = "no PRISM_FIDELITY_MEM line (the hook) for rank %s" % ",".join(str(r) for r in missing)
        return ms, count, hook, mega, prob

    def rows(self):
        nat_ms, nat_count, nat_hook, nat_mega, nat_prob = self.native_numbers()
        if nat_prob:  # Why: numbers from a native run that failed or is incomplete are no reference
            nat_ms, nat_count, nat_hook, nat_mega = None, 0, {}, {}
        rows = []
        for p in self.prism:
            row = {"config": self.name, "world": self.world, "ranks": ",".join(str(r) for r in p.ranks) or "?",
                   "payload": p.meta.get("payload", "mirror"), "run": p.name, "native_ms": nat_ms,
                   "native_iters": nat_count, "native_problem": nat_prob, "prism_ms": None, "prism_iters": 0,
                   "prism_report_ms": None, "prism_megatron_ms": None, "time_err": None, "native_mib": None,
                   "prism_mib": None, "mem_err": None, "mem_rank": None, "mem_source": "",
                   "mem_detail": "", "megatron_mem_err": None, "hook_vs_report_err": None, "problem": None,
                   "skipped": p.skipped, "wall_s": p.meta.get("wall_s", "")}
            rows.append(row)
            if p.skipped is not None:
                continue
            prob = p.problem()
            rep = p.report
            if rep is None:
                row["problem"] = prob or "no report.json"
                continue
            row["prism_report_ms"] = rep.get("iteration_time_s") * 1e3 if rep.get("iteration_time_s") else None
            per_iter = {}
            ranks_json = {int(x.get("rank", -1)): x for x in rep.get("ranks", [])}
            for r in p.ranks:
                times = (ranks_json.get(r) or {}).get("iteration_times_s") or []
                for k, t in enumerate(times):
                    if t is None:
                        continue
                    per_iter[k + 1] = max(per_iter.get(k + 1, 0.0), float(t) * 1e3)
            row["prism_ms"], row["prism_iters"] = median_after(per_iter, self.skip)
            row["prism_megatron_ms"] = median_after(megatron_iter_ms(p.text), self.skip)[0]
            row["time_err"] = pct(nat_ms, row["prism_ms"])
            # Memory: every real rank against the same native rank; the row keeps the worst.
            p_hook = hook_mem_bytes(p.text)
            p_mega = megatron_mem_mb(p.text)
            details, worst, unparsed = [], None, []
            for r in p.ranks:
                rep_b = (ranks_json.get(r) or {}).get("torch_max_allocated_bytes")
                source = "report"
                if rep_b is None and r in p_hook:
                    rep_b, source = p_hook[r], "prism-hook"
                if rep_b is None:
                    unparsed.append(r)
                elif row["prism_mib"] is None or rep_b / MIB > row["prism_mib"]:
                    row["prism_mib"] = rep_b / MIB  # shown even without a native run; replaced by the worst rank
                nat_b = nat_hook.get(r)
                err = pct(nat_b, rep_b)
                details.append("r%d:%s" % (r, "%+.4f%%" % err if err is not None else "n/a"))
                if err is not None and (worst is None or abs(err) > abs(worst[0])):
                    worst = (err, r, nat_b, rep_b, source)
                if r in p_mega and r in nat_mega:
                    e2 = pct(nat_mega[r], p_mega[r])
                    if e2 is not None and (row["megatron_mem_err"] is None or abs(e2) > abs(row["megatron_mem_err"])):
                        row["megatron_mem_err"] = e2
                if r in p_hook and (ranks_json.get(r) or {}).get("torch_max_allocated_bytes") is not None:
                    e3 = pct(p_hook[r], ranks_json[r]["torch_max_allocated_bytes"])
                    if e3 is not None and (row["hook_vs_report_err"] is None or abs(e3) > abs(row["hook_vs_report_err"])):
                        row["hook_vs_report_err"] = e3
            row["mem_detail"] = " ".join(details)
            if worst is not None:
                row["mem_err"], row["mem_rank"] = worst[0], worst[1]
                row["native_mib"], row["prism_mib"], row["mem_source"] = worst[2] / MIB, worst[3] / MIB, worst[4]
            if prob:
                row["problem"] = prob
            elif row["prism_ms"] is None:
                row["problem"] = "no iteration times after iteration %d in report.json" % self.skip
            elif unparsed:
                row["problem"] = "no torch max allocated for rank %s (report.json or the hook)" % (
                    ",".join(str(r) for r in unparsed))
        return rows

    def check(self):
        """(ok, one-line detail) for the suite's check row of this configuration."""
        problems, parts = [], []
        nat_ms, nat_count, _, _, nat_prob = self.native_numbers()
        if self.native is not None and self.native.skipped is not None:
            parts.append("native skipped (%s)" % self.native.skipped)
        elif nat_prob:
            problems.append("native: " + nat_prob)
        else:
            parts.append("native %.1f ms" % nat_ms)
        for o in self.others:
            if o.problem():
                problems.append("%s: %s" % (o.name, o.problem()))
        for row in self.rows():
            if row["skipped"] is not None:
                parts.append("%s skipped (%s)" % (row["ranks"], row["skipped"]))
                continue
            if row["problem"]:
                problems.append("prism %s: %s" % (row["ranks"], row["problem"]))
                continue
            t = "t=%s" % fmt_pct(row["time_err"], 2) if row["time_err"] is not None else "prism %.1f ms" % row["prism_ms"]
            m = "m=%s" % fmt_pct(row["mem_err"], 4) if row["mem_err"] is not None else ""
            parts.append(("r%s %s %s" % (row["ranks"], t, m)).strip())
        if not self.prism:
            problems.append("no prism runs")
        ok = not problems
        return ok, "; ".join(problems + parts)


def fmt_pct(v, digits):
    return "n/a" if v is None else ("%+." + str(digits) + "f%%") % v


def fmt_num(v, digits):
    return "n/a" if v is None else ("%." + str(digits) + "f") % v


# The suite's configurations in its order (tests/gpu/fidelity_suite.sh, fid_all_cases); others sort after them.
KNOWN_CONFIGS = ["tp2", "pp2", "dp2", "dp2_distopt_ovl", "moe_ep2", "tp2pp2", "tp4", "moe_ep4", "tp2pp2dp2",
                 "tp2pp2dp2_ovl", "tp4pp2", "tp2pp4"]


def find_configs(paths, skip=None):
    out = []
    for p in paths:
        if os.path.isfile(os.path.join(p, "config.txt")):
            out.append(Config(p, skip))
            continue
        if not os.path.isdir(p):
            continue
        for n in sorted(os.listdir(p)):
            q = os.path.join(p, n)
            if os.path.isfile(os.path.join(q, "config.txt")):
                out.append(Config(q, skip))
    known = {n: i for i, n in enumerate(KNOWN_CONFIGS)}
    out.sort(key=lambda c: (c.world, known.get(c.name, len(known)), c.name))
    return out


def summarize(rows):
    """(summary dict, verdict bool) over every row that was not skipped."""
    counted = [r for r in rows if r["skipped"] is None]
    t = [abs(r["time_err"]) for r in counted if r["time_err"] is not None]
    m = [abs(r["mem_err"]) for r in counted if r["mem_err"] is not None]
    incomplete = [r for r in counted if r["time_err"] is None or r["mem_err"] is None]
    s = {"rows": len(counted), "time_n": len(t), "mem_n": len(m), "incomplete": len(incomplete),
         "time_mean": statistics.mean(t) if t else None, "time_max": max(t) if t else None,
         "mem_max": max(m) if m else None}
    for label, sub in (("one", [r for r in counted if "," not in r["ranks"]]),
                       ("two", [r for r in counted if "," in r["ranks"]])):
        tt = [abs(r["time_err"]) for r in sub if r["time_err"] is not None]
        s[label + "_time_mean"] = statistics.mean(tt) if tt else None
        s[label + "_time_max"] = max(tt) if tt else None
    ok = (bool(t) and bool(m) and not incomplete and s["time_mean"] < TIME_MEAN_TARGET
          and s["time_max"] < TIME_MAX_TARGET and s["mem_max"] < MEM_MAX_TARGET)
    return s, ok


def verdict_line(s, ok):
    parts = ["mean |time err| %s (target < %.0f%%)" % (fmt_num(s["time_mean"], 2) + "%" if s["time_mean"] is not None else "n/a", TIME_MEAN_TARGET),
             "max %s (< %.0f%%)" % (fmt_num(s["time_max"], 2) + "%" if s["time_max"] is not None else "n/a", TIME_MAX_TARGET),
             "max |mem err| %s (< %.2f%%)" % (fmt_num(s["mem_max"], 4) + "%" if s["mem_max"] is not None else "n/a", MEM_MAX_TARGET),
             "one rank: mean %s max %s" % (fmt_num(s["one_time_mean"], 2), fmt_num(s["one_time_max"], 2)),
             "two ranks: mean %s max %s" % (fmt_num(s["two_time_mean"], 2), fmt_num(s["two_time_max"], 2)),
             "%d rows, %d incomplete" % (s["rows"], s["incomplete"])]
    return ("PASS: " if ok else "FAIL: ") + "; ".join(parts)


TSV_COLS = ["config", "world", "ranks", "payload", "native_ms", "prism_ms", "time_err_pct", "native_mib", "prism_mib",
            "mem_err_pct", "mem_rank", "mem_source", "mem_per_rank", "native_iters", "prism_iters",
            "prism_report_ms", "prism_megatron_ms", "megatron_mem_err_pct", "prism_hook_vs_report_pct", "wall_s",
            "status"]


def row_status(r):
    if r["skipped"] is not None:
        return "skipped: " + r["skipped"]
    if r["problem"]:
        return "problem: " + r["problem"]
    if r["native_problem"]:
        return "native: " + r["native_problem"]
    return "ok"


def tsv(rows):
    lines = ["\t".join(TSV_COLS)]
    for r in rows:
        vals = [r["config"], r["world"], r["ranks"], r["payload"], fmt_num(r["native_ms"], 2),
                fmt_num(r["prism_ms"], 2), fmt_num(r["time_err"], 3), fmt_num(r["native_mib"], 3),
                fmt_num(r["prism_mib"], 3), fmt_num(r["mem_err"], 5), r["mem_rank"] if r["mem_rank"] is not None else "",
                r["mem_source"], r["mem_detail"], r["native_iters"], r["prism_iters"], fmt_num(r["prism_report_ms"], 2),
                fmt_num(r["prism_megatron_ms"], 2), fmt_num(r["megatron_mem_err"], 5),
                fmt_num(r["hook_vs_report_err"], 5), r["wall_s"], row_status(r)]
        lines.append("\t".join(str(v).replace("\t", " ") for v in vals))
    return "\n".join(lines) + "\n"


def markdown(rows, s, ok, configs):
    out = ["| config | W | prism ranks | payload | native ms | prism ms | time err | native MiB | prism MiB | mem err | notes |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        note = "" if row_status(r) == "ok" else row_status(r)
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["config"], r["world"], r["ranks"], r["payload"], fmt_num(r["native_ms"], 1), fmt_num(r["prism_ms"], 1),
            fmt_pct(r["time_err"], 2), fmt_num(r["native_mib"], 2), fmt_num(r["prism_mib"], 2),
            fmt_pct(r["mem_err"], 4), note.replace("|", "/")))
    out.append("")
    out.append(verdict_line(s, ok) + ".")
    out.append("")
    out.append("Iteration times: median of iterations %s; errors are (prism - native) / native." %
               ", ".join(sorted({"%d..%s" % (c.skip + 1, c.cfg.get("iters", "N")) for c in configs})))
    out.append("")
    out.append("Commands (OUT is the suite's output directory; run from third_party/megatron):")
    out.append("")
    model_args = sorted({c.model_args for c in configs if c.model_args})
    if len(model_args) == 1:
        out.append("- `MODEL_ARGS=\"%s\"`" % model_args[0])
    for c in configs:
        runs = ([c.native] if c.native else []) + c.others + c.prism
        for run in runs:
            if run is None:
                continue
            what = ("skipped: " + run.skipped) if run.skipped is not None else (run.cmd or "(no cmd.txt)")
            if len(model_args) == 1:
                what = what.replace(model_args[0], "$MODEL_ARGS")
            out.append("- `%s/%s`: `%s`" % (c.name, run.name, what.replace("`", "'")))
    return "\n".join(out) + "\n"


def console(rows, s, ok):
    hdr = "%-16s %2s %-6s %-8s %9s %9s %8s %10s %10s %10s  %s" % (
        "config", "W", "ranks", "payload", "native_ms", "prism_ms", "t_err", "native_MiB", "prism_MiB", "m_err", "status")
    lines = [hdr]
    for r in rows:
        lines.append("%-16s %2s %-6s %-8s %9s %9s %8s %10s %10s %10s  %s" % (
            r["config"], r["world"], r["ranks"], r["payload"], fmt_num(r["native_ms"], 1), fmt_num(r["prism_ms"], 1),
            fmt_pct(r["time_err"], 2), fmt_num(r["native_mib"], 1), fmt_num(r["prism_mib"], 1), fmt_pct(r["mem_err"], 4),
            row_status(r)))
    lines.append(verdict_line(s, ok))
    return "\n".join(lines) + "\n"


def write(path, text):
    if path:
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


# --------------------------------------------------------------------------------------------------------- self-test

def _mega_iter_line(it, total, ms, gbs=8):
    # Built with the format strings of megatron/training/training.py training_log().
    s = " [2026-11-29 20:00:00.000000]"
    s += ' iteration {:8d}/{:8d} |'.format(it, total)
    s += ' consumed samples: {:12d} |'.format(it * gbs)
    s += ' elapsed time per iteration (ms): {:.1f} |'.format(ms)
    s += ' learning rate: {:.6E} |'.format(1e-4)
    s += ' global batch size: {:5d} |'.format(gbs)
    s += ' {}: {:.6E} |'.format("lm loss", 10.5)
    s += ' loss scale: {:.1f} |'.format(1.0)
    s += ' grad norm: {:.3f} |'.format(2.5)
    s += ' number of skipped iterations: {:3d} |'.format(0)
    s += ' number of nan iterations: {:3d} |'.format(0)
    return s


def _mega_mem_line(rank, it, alloc_mb, max_mb):
    # megatron/training/utils/common_utils.py report_memory() (values given in MB here)
    mb = mega_bytes = 1024.0 * 1024.0
    string = "(after {} iterations)".format(it) + ' memory (MB)'
    string += f" | allocated: {alloc_mb * mb / mega_bytes:.2f}"
    string += f" | max allocated: {max_mb * mb / mega_bytes:.2f}"
    string += f" | reserved: {max_mb + 100:.2f}"
    string += f" | max reserved: {max_mb + 100:.2f}"
    return "[Rank {}] {}".format(rank, string)


def _hook_line(rank, max_b):
    return "PRISM_FIDELITY_MEM rank=%d max_allocated_bytes=%d max_reserved_bytes=%d allocated_bytes=%d" % (
        rank, max_b, max_b + (1 << 26), max_b // 2)


def _mk(path, files):
    for rel, text in files.items():
        p = os.path.join(path, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)


def _report(ranks):
    return json.dumps({"schema_version": 1, "mode": "emulate", "world_size": 2, "iteration_time_s": 0.0505,
                       "ranks": [dict(rank=r, iteration_times_s=t, torch_max_allocated_bytes=b,
                                      peak_memory_bytes=(b or 0) + (1 << 28)) for r, t, b in ranks]})


def self_test():
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    tmp = tempfile.mkdtemp(prefix="fidelity-selftest-")
    try:
        root = os.path.join(tmp, "fidelity")
        cfg = os.path.join(root, "tp2")
        iters, skip = 30, 10
        # Native: iterations 1..10 slow (warm-up), 11..30 at 50.0 ms except one 80.0 outlier the median ignores.
        nat = []
        for it in range(1, iters + 1):
            ms = 400.0 if it <= skip else (80.0 if it == 20 else 50.0)
            nat.append(_mega_iter_line(it, iters, ms))
            if it in (1, 2):
                nat.append(_mega_mem_line(0, it, 1000.0, 2000.00))
        nat += ["[rank garbage line]", _hook_line(0, 2_000_000_000), _hook_line(1, 2_000_000_000),
                _hook_line(1, 1_000)]  # a forked helper's smaller line: the largest per rank counts
        r0_times = [None] + [0.3] * 9 + [0.0505] * 20           # iterations 11..30: 50.5 ms (+1.0 %)
        r1_times = [None] + [0.3] * 9 + [0.0490] * 20           # 49.0 ms
        _mk(root, {"model_args.txt": "--num-layers 8 --hidden-size 2048\n"})
        _mk(cfg, {
            "config.txt": "name=tp2\nworld=2\ntp=2\npp=1\nep=1\ndp=1\ngbs=8\niters=30\nskip=10\n",
            "native/meta.txt": "kind=native\nrc=0\nwall_s=41\n",
            "native/cmd.txt": "CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 pretrain_gpt.py --num-layers 8 "
                              "--hidden-size 2048 --train-iters 30\n",
            "native/out.log": "\n".join(nat) + "\n",
            "prism_r0/meta.txt": "kind=prism\nranks=0\npayload=mirror\nrc=0\nwall_s=50\n",
            "prism_r0/cmd.txt": "prism-run --ranks 0 ...\n",
            "prism_r0/report.json": _report([(0, r0_times, 2_000_000_000)]),
            "prism_r0/logs/rank0.log": _mega_mem_line(0, 2, 1000.0, 2000.00) + "\n" + _hook_line(0, 2_000_000_000) + "\n",
            "prism_r1/meta.txt": "kind=prism\nranks=1\npayload=recorded\nrc=0\nwall_s=52\n",
            "prism_r1/report.json": _report([(1, r1_times, 2_000_100_000)]),   # +0.005 %
            "prism_r1/logs/rank1.log": "\n".join(_mega_iter_line(i, iters, 49.2) for i in range(1, iters + 1)) + "\n",
            "prism_r0-1/meta.txt": "kind=prism\nranks=0,1\npayload=mirror\nrc=0\nwall_s=60\n",
            "prism_r0-1/report.json": _report([(0, r0_times, 2_000_000_000), (1, r1_times, 2_000_000_000)]),
            "collect/meta.txt": "kind=collect\nrc=0\nwall_s=70\n",
        })
        # Parsers on their own.
        expect(megatron_iter_ms(_mega_iter_line(7, 30, 36.2)) == {7: 36.2}, "iteration line")
        expect(megatron_mem_mb(_mega_mem_line(3, 2, 1.0, 158.6)) == {3: 158.6}, "memory line")
        expect(hook_mem_bytes(_hook_line(5, 123)) == {5: 123}, "hook line")
        expect(parse_ranks("0,4-6") == [0, 4, 5, 6], "rank list")
        expect(pct(50.0, 50.5) is not None and abs(pct(50.0, 50.5) - 1.0) < 1e-9, "pct")

        c = find_configs([root])
        expect(len(c) == 1 and c[0].name == "tp2", "config found")
        rows = c[0].rows()
        by = {r["ranks"]: r for r in rows}
        expect(set(by) == {"0", "1", "0,1"}, "rows %s" % sorted(by))
        expect(by["0"]["native_ms"] == 50.0, "native median %s" % by["0"]["native_ms"])
        expect(abs(by["0"]["prism_ms"] - 50.5) < 1e-9 and abs(by["0"]["time_err"] - 1.0) < 1e-9,
               "rank 0 time %s %s" % (by["0"]["prism_ms"], by["0"]["time_err"]))
        expect(abs(by["1"]["time_err"] + 2.0) < 1e-9, "rank 1 time err %s" % by["1"]["time_err"])
        expect(abs(by["1"]["prism_megatron_ms"] - 49.2) < 1e-9, "prism megatron ms")
        # Two real ranks: per iteration the slower (rank 0, 50.5 ms).
        expect(abs(by["0,1"]["prism_ms"] - 50.5) < 1e-9, "two-rank time %s" % by["0,1"]["prism_ms"])
        expect(by["0"]["mem_err"] == 0.0 and by["0"]["megatron_mem_err"] == 0.0, "rank 0 memory")
        expect(abs(by["1"]["mem_err"] - 0.005) < 1e-9 and by["1"]["mem_rank"] == 1, "rank 1 memory %s" % by["1"]["mem_err"])
        expect(by["0"]["hook_vs_report_err"] == 0.0, "hook vs report")
        expect(by["1"]["payload"] == "recorded", "payload")
        ok, detail = c[0].check()
        expect(ok, "check should pass: " + detail)
        s, v = summarize(rows)
        # |errors| 1.0, 2.0, 1.0: mean 1.333 > 1 -> targets FAIL, max 2.0 not < 2 -> FAIL
        expect(not v and abs(s["time_mean"] - 4.0 / 3.0) < 1e-9 and s["time_max"] == 2.0, "summary %s" % s)
        expect(abs(s["mem_max"] - 0.005) < 1e-9, "mem max")
        md = markdown(rows, s, v, c)
        expect("| tp2 | 2 | 0,1 | mirror | 50.0 | 50.5 | +1.00% |" in md, "markdown row:\n" + md)
        expect("FAIL: mean |time err| 1.33%" in md, "markdown verdict")
        expect("`tp2/native`: `CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 pretrain_gpt.py $MODEL_ARGS "
               "--train-iters 30`" in md and '`MODEL_ARGS="--num-layers 8 --hidden-size 2048"`' in md,
               "markdown commands:\n" + md)
        t = tsv(rows)
        expect(t.splitlines()[0].split("\t") == TSV_COLS and len(t.splitlines()) == 4, "tsv shape")

        # Within the targets: move rank 1 to 50.2 ms and 0.2 % rank 0 -> |errors| 1.0 (r0), 0.4, 1.0 -> mean 0.8.
        _mk(cfg, {"prism_r1/report.json": _report([(1, [None] + [0.3] * 9 + [0.0502] * 20, 2_000_000_000)])})
        s, v = summarize(find_configs([root])[0].rows())
        expect(v and abs(s["time_mean"] - 0.8) < 1e-9, "targets should pass: %s" % s)
        # Memory over 0.01 % fails the targets.
        _mk(cfg, {"prism_r1/report.json": _report([(1, [None] + [0.3] * 9 + [0.0502] * 20, 2_000_300_000)])})
        s, v = summarize(find_configs([root])[0].rows())
        expect(not v and abs(s["mem_max"] - 0.015) < 1e-9, "memory target")

        # A failed run: the check fails and says why; the row is incomplete, so the targets fail.
        _mk(cfg, {"prism_r0-1/meta.txt": "kind=prism\nranks=0,1\nrc=124\nwall_s=300\n"})
        os.remove(os.path.join(cfg, "prism_r0-1", "report.json"))
        ok, detail = find_configs([cfg])[0].check()
        expect(not ok and "prism 0,1: exit 124 (timeout)" in detail, "failed run detail: " + detail)
        s, v = summarize(find_configs([cfg])[0].rows())
        expect(not v and s["incomplete"] == 1, "incomplete row")
        # A failed collect fails the check too.
        _mk(cfg, {"prism_r0-1/meta.txt": "kind=prism\nranks=0,1\nskipped=needs 2 GPUs\n",
                  "collect/meta.txt": "kind=collect\nrc=1\nwall_s=9\n"})
        ok, detail = find_configs([cfg])[0].check()
        expect(not ok and "collect: exit 1" in detail and "0,1 skipped (needs 2 GPUs)" in detail, "collect: " + detail)

        # One GPU (smoke test): native skipped, prism runs fine -> the check passes, the targets cannot.
        _mk(cfg, {"native/meta.txt": "kind=native\nskipped=needs 2 GPUs (this host has 1)\n",
                  "native/out.log": "", "collect/meta.txt": "kind=collect\nrc=0\n"})
        ok, detail = find_configs([cfg])[0].check()
        expect(ok and "native skipped" in detail, "smoke check: " + detail)
        s, v = summarize(find_configs([cfg])[0].rows())
        expect(not v and s["time_n"] == 0, "smoke targets")
        # A native run without iteration lines fails its check.
        _mk(cfg, {"native/meta.txt": "kind=native\nrc=0\n", "native/out.log": _hook_line(0, 5) + "\n"})
        ok, detail = find_configs([cfg])[0].check()
        expect(not ok and "elapsed time per iteration" in detail, "native without lines: " + detail)
        # The hook compiles, and imports without torch (nothing printed, nothing raised).
        compile(HOOK_SOURCE, "sitecustomize.py", "exec")
        hook_dir = os.path.join(tmp, "hook")
        write_hook(hook_dir)
        ns = {"__file__": os.path.join(hook_dir, "sitecustomize.py"), "__name__": "sitecustomize"}
        exec(compile(HOOK_SOURCE, ns["__file__"], "exec"), ns)
        ns["_prism_fidelity_report"]()
        # In a real interpreter: the hook chains the next sitecustomize on the path and prints its line at exit.
        third, fake = os.path.join(tmp, "third"), os.path.join(tmp, "fake")
        _mk(third, {"sitecustomize.py": "print('third sitecustomize')\n"})
        _mk(fake, {"torch/__init__.py": "class _C:\n    def is_initialized(self): return True\n"
                   "    def max_memory_allocated(self): return 123\n    def max_memory_reserved(self): return 456\n"
                   "    def memory_allocated(self): return 7\ncuda = _C()\n"})
        import subprocess
        env = dict(os.environ, RANK="3", PYTHONPATH=os.pathsep.join([hook_dir, third, fake]))
        res = subprocess.run([sys.executable, "-c", "import torch; print('main')"], env=env, cwd=tmp,
                             capture_output=True, text=True, timeout=60)
        expect(res.stdout.splitlines() == ["third sitecustomize", "main",
                                           "PRISM_FIDELITY_MEM rank=3 max_allocated_bytes=123 max_reserved_bytes=456 "
                                           "allocated_bytes=7"] and hook_mem_bytes(res.stdout) == {3: 123},
               "hook in a real interpreter: %r %r" % (res.stdout, res.stderr))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # The atexit registration of the exec'd hook above is harmless (torch is not imported here).
    if failures:
        print("fidelity_table self-test: %d FAILED" % len(failures))
        for f in failures:
            print("  - " + f)
        return 1
    print("fidelity_table self-test: PASS")
    return 0


def write_hook(d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "sitecustomize.py"), "w") as f:
        f.write(HOOK_SOURCE)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="*", help="fidelity roots (OUT/fidelity) or configuration directories")
    ap.add_argument("--check", metavar="CONFIG_DIR")
    ap.add_argument("--tsv")
    ap.add_argument("--md")
    ap.add_argument("--detail", help="write the one-line summary here")
    ap.add_argument("--targets", action="store_true", help="exit 0 only when the targets are met")
    ap.add_argument("--skip", type=int, help="warm-up iterations left out (default: the suite's, config.txt)")
    ap.add_argument("--write-hook", metavar="DIR")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()
    if a.write_hook:
        write_hook(a.write_hook)
        return 0
    if a.check:
        c = Config(a.check, a.skip)
        ok, detail = c.check()
        rows = c.rows()
        s, v = summarize(rows)
        sys.stdout.write(console(rows, s, v))
        for r in ([c.native] if c.native else []) + c.others + c.prism:
            if r is not None and r.problem():
                tail = r.text.strip().splitlines()[-25:]
                sys.stdout.write("\n== %s: %s; last lines:\n%s\n" % (r.name, r.problem(), "\n".join(tail)))
        sys.stdout.write(("PASS " if ok else "FAIL ") + detail + "\n")
        write(a.detail, detail + "\n")
        return 0 if ok else 1
    if not a.dirs:
        ap.error("give fidelity roots or configuration directories (or --self-test)")
    configs = find_configs(a.dirs, a.skip)
    rows = [r for c in configs for r in c.rows()]
    s, ok = summarize(rows)
    sys.stdout.write(console(rows, s, ok))
    write(a.tsv, tsv(rows))
    write(a.md, markdown(rows, s, ok, configs))
    write(a.detail, verdict_line(s, ok) + "\n")
    if not configs:
        sys.stdout.write("no configuration directories under %s\n" % " ".join(a.dirs))
        return 1
    return 0 if (ok or not a.targets) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
