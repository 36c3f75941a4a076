#!/usr/bin/env python3
"""Judges the chaos suite's scenarios (scripts/chaos.sh) from the load test's
summary.json: the verdict's invariants, and what fans saw in and outside the
fault window. Standard library only.

  chaos_judge.py row --scenario S --summary F --loadtest-exit N --fault-start T
                     --fault-end T --recovered T --grace S [--process-exit N]
  chaos_judge.py line RESULTS       the last row, one line
  chaos_judge.py table RESULTS [--mode M] [--into FILE]
  chaos_judge.py passed RESULTS     exit 0 if every scenario passed
  chaos_judge.py last-passed RESULTS
                                    exit 0 if the last scenario passed
  chaos_judge.py failed-check RESULTS NAME
                                    exit 0 if some scenario's verdict check NAME failed
"""
import argparse
import json
import math
import sys

BEGIN = "<!-- chaos:begin -->"
END = "<!-- chaos:end -->"

# The invariants the table shows, by the verdict's check names.
INVARIANTS = [
    ("oversold", "never oversold"),
    ("2 orders / admission", "one admission buys once"),
    ("ticket sets", "one ticket set per confirmed order"),
    ("money", "no money kept without a confirmed order or a refund"),
    ("stuck", "every order settled"),
]


def failed_answer(status):
    return status == "none" or status.startswith("5")


def row(args):
    out = {
        "scenario": args.scenario,
        "loadtest_exit": args.loadtest_exit,
        "process_exit": args.process_exit or None,
        "recovery_s": None,
        "checks": {},
        "verdict": False,
        "during": {},
        "failed_outside": None,
        "answers": 0,
        "confirmed": 0,
        "problems": [],
    }
    try:
        with open(args.summary) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        out["problems"].append(f"no load-test summary ({e})")
        out["pass"] = False
        print(json.dumps(out))
        return
    verdict = summary["verdict"]
    out["verdict"] = verdict["pass"]
    out["confirmed"] = verdict["confirmed_orders"]
    out["checks"] = {c["name"]: {"holds": c["holds"], "detail": c["detail"]} for c in verdict["checks"]}
    fault_start = float(args.fault_start)
    end = float(args.recovered) if args.recovered else None
    if end is not None:
        out["recovery_s"] = round(max(0.0, end - float(args.fault_end)), 1)
    else:
        out["problems"].append("the stack never came back")
        end = float(args.fault_end)
    lo, hi = math.floor(fault_start), math.ceil(end) + args.grace
    during, failed_outside = {}, 0
    for second, statuses in summary["answers_by_second"].items():
        second = int(second)
        for status, n in statuses.items():
            out["answers"] += n
            if lo <= second <= hi:
                during[status] = during.get(status, 0) + n
            elif failed_answer(status):
                failed_outside += n
    out["during"] = dict(sorted(during.items()))
    out["failed_outside"] = failed_outside
    if not verdict["pass"]:
        out["problems"] += [f"{c['name']}: {c['detail']}" for c in verdict["checks"] if not c["holds"]]
    if failed_outside:
        out["problems"].append(f"{failed_outside} 5xx or unanswered outside the fault window")
    if args.scenario.startswith("term-") and args.process_exit not in (None, "", "0"):
        out["problems"].append(f"exited {args.process_exit} on SIGTERM")
    if args.loadtest_exit not in (0, 1):
        out["problems"].append(f"the load test could not run (exit {args.loadtest_exit})")
    out["pass"] = not out["problems"]
    print(json.dumps(out))


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cell(r, check):
    c = r["checks"].get(check)
    if c is None:
        return "?"
    return "0" if c["holds"] else "**✗** " + c["detail"].replace("|", "/")


def table(rows, mode):
    head = ["scenario", "result"] + [name for name, _ in INVARIANTS] + [
        "5xx/unanswered outside fault",
        "fans saw during fault (status: answers)",
        "recovery",
        "confirmed orders",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        during = ", ".join(f"{s}: {n}" for s, n in r["during"].items()) or "–"
        exit_note = f" (exit {r['process_exit']})" if r["scenario"].startswith("term-") and r["process_exit"] is not None else ""
        recovery = "–" if r["recovery_s"] is None else f"{r['recovery_s']} s"
        cells = [r["scenario"] + exit_note, "PASS" if r["pass"] else "**FAIL**"]
        cells += [cell(r, check) for _, check in INVARIANTS]
        cells += [str(r["failed_outside"]), during, recovery, str(r["confirmed"])]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in rows if not r["pass"]]
    lines.append("")
    lines.append(f"{len(rows) - len(failed)} of {len(rows)} scenarios passed ({mode} run).")
    for r in failed:
        lines.append(f"- {r['scenario']}: " + "; ".join(r["problems"]))
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("row")
    r.add_argument("--scenario", required=True)
    r.add_argument("--summary", required=True)
    r.add_argument("--loadtest-exit", type=int, required=True)
    r.add_argument("--fault-start", required=True)
    r.add_argument("--fault-end", required=True)
    r.add_argument("--recovered", default="")
    r.add_argument("--grace", type=int, default=5)
    r.add_argument("--process-exit", default="")
    ln = sub.add_parser("line")
    ln.add_argument("results")
    t = sub.add_parser("table")
    t.add_argument("results")
    t.add_argument("--mode", default="full")
    t.add_argument("--into")
    ps = sub.add_parser("passed")
    ps.add_argument("results")
    lp = sub.add_parser("last-passed")
    lp.add_argument("results")
    fc = sub.add_parser("failed-check")
    fc.add_argument("results")
    fc.add_argument("name")
    a = p.parse_args()
    if a.cmd == "row":
        row(a)
    elif a.cmd == "line":
        last = load(a.results)[-1]
        verdict = "PASS" if last["pass"] else "FAIL: " + "; ".join(last["problems"])
        print(f"==> {last['scenario']}: {verdict} (recovery {last['recovery_s']} s, during the fault {last['during']})")
    elif a.cmd == "table":
        text = table(load(a.results), a.mode)
        if a.into:
            with open(a.into) as f:
                doc = f.read()
            if BEGIN not in doc or END not in doc:
                sys.exit(f"{a.into} has no {BEGIN} … {END} section")
            head, rest = doc.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            with open(a.into, "w") as f:
                f.write(head + BEGIN + "\n" + text + END + tail)
        else:
            sys.stdout.write(text)
    elif a.cmd == "failed-check":
        rows = load(a.results)
        failed = any(r["checks"].get(a.name, {}).get("holds") is False for r in rows)
        sys.exit(0 if failed else 1)
    elif a.cmd == "last-passed":
        rows = load(a.results)
        sys.exit(0 if rows and rows[-1]["pass"] else 1)
    elif a.cmd == "passed":
        rows = load(a.results)
        sys.exit(0 if rows and all(r["pass"] for r in rows) else 1)


if __name__ == "__main__":
    main()
