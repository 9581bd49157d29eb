"""JUnit XML: one testcase per check and node, so CI shows each as a test. A summary that quotes a
node's words has its control characters written out (node/terminal.py): XML 1.0 cannot hold
them, and a CI page shows the text as it is."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ddp_preflight.node.terminal import shown, shown_text

from ..model import Report, Status


def render(report: Report, strict: bool = False) -> str:
    """With strict, a warning is a failed test, as it fails the run."""
    failing = (Status.FAIL, Status.WARN) if strict else (Status.FAIL,)
    suite = ET.Element("testsuite", name="ddp-preflight", tests=str(len(report.results)),
                       failures=str(sum(r.status in failing for r in report.results)),
                       errors=str(sum(r.status == Status.ERROR for r in report.results)),
                       skipped=str(sum(r.status == Status.SKIP for r in report.results)))
    for r in report.results:
        check, node, summary = shown(r.check), shown(r.node or "cluster"), shown(r.summary)
        case = ET.SubElement(suite, "testcase", classname=f"ddp-ddp_preflight.preflight.{check}", name=f"{check} [{node}]")
        message = shown_text(r.summary + (f"\nfix: {r.fix}" if r.fix else ""))
        if r.status in failing:
            ET.SubElement(case, "failure", message=summary).text = message
        elif r.status == Status.ERROR:
            ET.SubElement(case, "error", message=summary).text = message
        elif r.status == Status.SKIP:
            ET.SubElement(case, "skipped", message=summary)
        elif r.status == Status.WARN:
            ET.SubElement(case, "system-out").text = "warning: " + message
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
