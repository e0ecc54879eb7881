#!/usr/bin/python3
"""CI's closing report: reads what scripts/ci.sh left in its output folder (each leg's phase
times, JUnit results and status) and prints the table of where the time went and the ten
slowest tests; writes the same as summary.json there, which scripts/docs_figures.py turns
into docs/testing.md's tables once copied to docs/figures/.

  scripts/ci_report.py OUT_DIR      (scripts/ci.sh runs it; OUT_DIR is build/ci by default)

OUT_DIR holds, per leg, LEG.times ("PHASE MILLISECONDS STATUS" lines), LEG.xml (ctest's
JUnit file) and run.json (the legs' statuses, seconds and budgets, and the run's facts).
"""
import json
import os
import sys
import xml.etree.ElementTree as ET

PHASES = ["wait", "root", "setup", "configure", "build", "test", "fuzz"]


def mmss(seconds):
    s = round(seconds)
    return f"{s // 60}:{s % 60:02d}"


def phases(out, leg):
    """A leg's phase times in seconds (a phase run more than once: their sum)."""
    times = {}
    path = os.path.join(out, leg + ".times")
    if os.path.exists(path):
        for line in open(path):
            name, ms, _ = line.split()
            times[name] = times.get(name, 0) + int(ms) / 1000
    return times


def tests(out, leg):
    """(cases, counts) from a leg's JUnit file: each case's seconds, name and status."""
    path = os.path.join(out, leg + ".xml")
    if not os.path.exists(path):
        return [], None
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        cases.append({"seconds": round(float(case.get("time", 0)), 1), "test": case.get("name"),
                      "status": case.get("status", "run")})
    counts = {"entries": len(cases),
              "passed": sum(c["status"] == "run" for c in cases),
              "skipped": sum(c["status"] in ("notrun", "disabled") for c in cases)}
    counts["failed"] = counts["entries"] - counts["passed"] - counts["skipped"]
    return cases, counts


def summarise(out):
    run = json.load(open(os.path.join(out, "run.json")))
    legs, every_case = [], []
    for leg in run["legs"]:
        name = leg["leg"]
        cases, counts = tests(out, name)
        leg = dict(leg, phases={k: round(v, 1) for k, v in phases(out, name).items()})
        if counts:
            leg["tests"] = counts
        legs.append(leg)
        every_case += [dict(c, leg=name) for c in cases]
    every_case.sort(key=lambda c: -c["seconds"])
    summary = dict(run, legs=legs, test_runs=len(every_case), slowest=every_case[:10])
    return summary


def table(summary):
    """The legs' phases as text lines (what CI prints)."""
    header = ["leg"] + PHASES + ["total", "budget", "status"]
    rows = []
    for leg in summary["legs"]:
        p = leg["phases"]
        rows.append([leg["leg"]] + [mmss(p[c]) if c in p else "-" for c in PHASES] +
                    [mmss(leg["seconds"]), mmss(leg["budget"]), leg["status"]])
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) if i in (0, len(header) - 1) else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths))) for r in [header] + rows]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/ci_report.py OUT_DIR")
    out = sys.argv[1]
    summary = summarise(out)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print()
    print(f"ci: where the time went (min:s; {summary['caches']} caches; roots ran in the background, "
          "beside debian12)")
    for line in table(summary):
        print(line)
    print()
    print(f"ci: the ten slowest of {summary['test_runs']} test runs")
    for c in summary["slowest"]:
        status = "" if c["status"] == "run" else f"  ({c['status']})"
        print(f"  {c['seconds']:7.1f} s  {c['leg']:<10}  {c['test']}{status}")


if __name__ == "__main__":
    main()
