"""JUnit XML for scenario runs: the dialect CI servers read."""
from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ._scenario import ScenarioResult


def _xml_text(text: str) -> str:
    """Drop what XML 1.0 cannot hold at all (ElementTree escapes the rest, but not these)."""
    return "".join(ch if ch in "\t\n\r" or ("\x20" <= ch <= "\ud7ff") or ("\ue000" <= ch <= "\ufffd")
                   or ch >= "\U00010000" else "\ufffd" for ch in str(text))


def write_junit(results: Sequence[ScenarioResult], path: str, suite: str = "streamengine.harness") -> None:
    """JUnit XML (the dialect CI servers read): one testcase per scenario."""
    failures = sum(1 for r in results if r.failures and r.error is None)
    errors = sum(1 for r in results if r.error is not None)
    total = sum(r.duration_s for r in results)
    attrs = {"name": suite, "tests": str(len(results)), "failures": str(failures), "errors": str(errors),
             "skipped": "0", "time": f"{total:.3f}"}
    root = ET.Element("testsuites", attrs)
    suite_el = ET.SubElement(root, "testsuite", dict(attrs, timestamp=time.strftime("%Y-%m-%dT%H:%M:%S")))
    for r in results:
        case = ET.SubElement(suite_el, "testcase", {"classname": suite, "name": _xml_text(r.name),
                                                    "file": _xml_text(r.source), "time": f"{r.duration_s:.3f}"})
        if r.error is not None:
            ET.SubElement(case, "error", {"message": _xml_text(r.error), "type": "ScenarioError"}).text = \
                _xml_text(r.error)
        elif r.failures:
            ET.SubElement(case, "failure", {"message": _xml_text(r.failures[0]), "type": "AssertionError"}).text = \
                _xml_text("\n".join(r.failures))
        if r.transcript:
            ET.SubElement(case, "system-out").text = _xml_text(r.transcript)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
