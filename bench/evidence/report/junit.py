"""junit.xml: one <testcase> per assertion, a failure or error with its value and expression, skipped
when the run is inconclusive."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from bench.evidence.report.outcome import RunOutcome


def write_junit(o: RunOutcome, path: Path) -> None:
    inconclusive = o.verdict == "inconclusive"
    why = "inconclusive: the bench host was out of its fidelity tolerances: " + "; ".join(
        (o.meta.get("fidelity") or {}).get("reasons") or []
    )
    failures = 0 if inconclusive else sum(1 for r in o.assertions if not r.passed and not r.error)
    skipped = sum(1 for r in o.assertions if not r.passed and not r.error) if inconclusive else 0
    errors = sum(1 for r in o.assertions if r.error) + (1 if o.error else 0)
    suite = ET.Element(
        "testsuite",
        name=f"bench.{o.scenario_name}",
        tests=str(len(o.assertions) + (1 if o.error else 0)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time=f"{o.wall_s:.3f}",
        timestamp=o.started_utc,
    )
    if o.error:
        case = ET.SubElement(
            suite, "testcase", classname=f"bench.{o.scenario_name}", name="run", time=f"{o.wall_s:.3f}"
        )
        ET.SubElement(case, "error", message=o.error[:500], type="RunError").text = o.error
    for r in o.assertions:
        case = ET.SubElement(suite, "testcase", classname=f"bench.{o.scenario_name}", name=r.expression, time="0")
        if r.error:
            ET.SubElement(case, "error", message=r.error, type="AssertionError").text = f"{r.expression}\n{r.error}"
        elif not r.passed and inconclusive:
            bare = (
                f"\nwithout the bench's measured share: {r.without_bench['value']!r} ({r.without_bench['result']})"
                if r.without_bench
                else ""
            )
            ET.SubElement(case, "skipped", message=why[:500]).text = f"{r.expression}\nvalue: {r.value!r}{bare}\n{why}"
        elif not r.passed:
            ET.SubElement(case, "failure", message=f"value {r.value!r}", type="AssertionFailed").text = (
                f"{r.expression}\nvalue: {r.value!r}\n"
                + (
                    f"(line {r.line} of the scenario)"
                    if r.line
                    else "(not a line of the scenario: judged by the bench)"
                )
            )
        ET.SubElement(case, "system-out").text = f"value: {r.value!r}"
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n")
