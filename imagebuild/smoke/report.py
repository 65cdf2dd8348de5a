"""Results of one smoke run: JUnit XML (with the boot as its first case), verdict, summary."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from imagebuild.buildfolder import VERDICT_FILE

OUTCOMES = ("failure", "error", "skipped")


def read_junit(path: Path) -> list[dict[str, Any]]:
    """Per-test results from pytest's JUnit XML."""
    checks = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in OUTCOMES:
                outcome = {"failure": "failed", "error": "error"}.get(child.tag, "skipped")
                message = (child.get("message") or "").strip()
                detail = (child.text or "").strip()
                if outcome != "skipped" and detail:
                    message = detail
                break
        measured = {prop.get("name", "?"): _number(prop.get("value", ""))
                    for prop in case.iter("property")}
        check = {"name": case.get("name", "?").removeprefix("test_"), "outcome": outcome,
                 "seconds": round(float(case.get("time") or 0), 2), "message": message}
        if measured:
            check["measured"] = measured  # figures a check recorded (record_property)
        checks.append(check)
    return checks


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def write_junit(path: Path, image_ref: str, boot: dict[str, Any], checks_xml: Path | None,
                extra: list[dict[str, Any]] | None = None) -> None:
    """pytest's cases behind a `boot` case, so a boot failure is a red test too; `extra`:
    checks made outside the suite (a multi-node cell's node checks), after pytest's."""
    if checks_xml and checks_xml.exists():
        root = ET.parse(checks_xml).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        assert suite is not None
    else:
        root = ET.Element("testsuites")
        suite = ET.SubElement(root, "testsuite", name="smoke", tests="0", failures="0",
                              errors="0", skipped="0", time="0")
    suite.set("name", f"smoke {image_ref}")
    case = ET.Element("testcase", classname="smoke", name="boot",
                      time=f"{boot['seconds']:.3f}")
    if boot["kind"] != "ready":
        fail = ET.SubElement(case, "failure", message=boot["message"])
        fail.text = boot.get("excerpt", "")
        suite.set("failures", str(int(suite.get("failures", "0")) + 1))
    suite.insert(0, case)
    suite.set("tests", str(int(suite.get("tests", "0")) + 1))
    for check in extra or []:
        node = ET.SubElement(suite, "testcase", classname="smoke.nodes", name=check["name"],
                             time=f"{check['seconds']:.3f}")
        if check["outcome"] != "passed":
            ET.SubElement(node, "failure", message=check["message"][:500]).text = \
                check["message"]
            suite.set("failures", str(int(suite.get("failures", "0")) + 1))
        suite.set("tests", str(int(suite.get("tests", "0")) + 1))
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def summary_markdown(v: dict[str, Any]) -> str:
    mark = {"passed": "✅", "failed": "❌", "error": "❌", "skipped": "➖"}
    t = v["timings"]
    lines = [
        f"# Smoke: {v['image_ref']}",
        "",
        f"**{'PASSED' if v['passed'] else 'FAILED'}** · {v['message']}",
        "",
        f"- image id: `{v['image_id']}`",
        f"- cell: {v.get('cell') or '?'} · engine {v.get('engine') or '?'} · "
        f"target {v.get('target') or '?'} (expectations from {v.get('expect_source')})",
        f"- boot: {v['boot']['kind']} in {v['boot']['seconds']:.1f}s "
        f"(phase {v['boot']['phase']})" + (" · relaunched once after a silent spawn hang"
                                           if v.get("relaunched") else ""),
        f"- timings: boot {t['boot_s']:.1f}s · checks {t.get('checks_s', 0):.1f}s · "
        f"total {t['total_s']:.1f}s"
        + (f" · fatal line to verdict {t['fatal_to_verdict_s']:.1f}s"
           if t.get("fatal_to_verdict_s") is not None else ""),
        "",
        "| check | result | s |",
        "|---|---|---|",
    ]
    for name, c in v["checks"].items():
        first = c["message"].splitlines()[0][:120] if c["message"] else ""
        note = f" — {first}" if first and c["outcome"] != "passed" else ""
        if c.get("measured"):
            note += " (" + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in c["measured"].items()) + ")"
        lines.append(f"| {name} | {mark.get(c['outcome'], '?')} {c['outcome']}{note} "
                     f"| {c['seconds']:.1f} |")
    for name, why in v.get("not_applicable", {}).items():
        lines.append(f"| {name} | {mark['skipped']} not applicable — {why[:120]} | |")
    if not v["boot"]["kind"] == "ready" and v["boot"].get("excerpt"):
        lines += ["", "## Boot log excerpt", "", "```", v["boot"]["excerpt"], "```"]
    lines += ["", f"Full container log: `{v['files']['log']}`", ""]
    return "\n".join(lines)


def write_verdict(out_dir: Path, verdict: dict[str, Any]) -> None:
    (out_dir / "summary.md").write_text(summary_markdown(verdict))
    (out_dir / VERDICT_FILE).write_text(json.dumps(verdict, indent=2) + "\n")
