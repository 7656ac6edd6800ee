"""JUnit XML of check's verdicts: the schema CI systems read."""

from __future__ import annotations

import xml.etree.ElementTree as ET


def junit_xml(verdicts: list, suite: str, seconds: float, warnings: list[str] = ()) -> str:
    """One testcase per threshold, a <failure> when it is violated; `warnings` (render/warnings.py)
    as the suite's properties and its <system-err>, which fail nothing."""
    failures = sum(not v.passed for v in verdicts)
    root = ET.Element("testsuites", name="odmactl check", tests=str(len(verdicts)), failures=str(failures),
                      errors="0", time=f"{seconds:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(verdicts)), failures=str(failures),
                       errors="0", skipped="0", time=f"{seconds:.3f}")
    if warnings:
        properties = ET.SubElement(ts, "properties")
        for line in warnings:
            ET.SubElement(properties, "property", name="warning", value=line)
    for v in verdicts:
        case = ET.SubElement(ts, "testcase", classname="odmactl.check", name=v.name, time="0")
        if not v.passed:
            failure = ET.SubElement(case, "failure", message=v.text, type="ThresholdViolated")
            failure.text = v.text
        ET.SubElement(case, "system-out").text = v.text
    if warnings:
        ET.SubElement(ts, "system-err").text = "\n".join(f"warning: {line}" for line in warnings)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
