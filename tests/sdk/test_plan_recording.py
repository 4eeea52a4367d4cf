"""The recording pass behind plans (``graphene_sdk._plan``), in this process: what a placeholder
lets code do with a value it does not know (pass it on) and what stops the plan (needing it),
the assumptions it notes, agent calls, artifacts and sleeps as entries, the world's ownership
rules still refusing what the engine refuses, and a plan that would not end."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from graphene_sdk import Context, pipeline
from graphene_sdk._plan import PlanFailed, plan
from pydantic import BaseModel


class In(BaseModel):
    case: str = "pass"


def _line(marker: str) -> int:
    """The line of this file that holds ``marker`` (a comment on the line under test)."""
    lines = Path(__file__).read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if marker in text and "_line(" not in text)


@pipeline("plan.cases", inputs=In)
def cases(ctx: Context, inputs: In) -> None:
    db = ctx.declare("test.sleep", "db")
    outputs = db.ready()
    host = outputs["host"]
    port = outputs.get("port")
    url = f"postgres://{host}:{port}/{outputs['database'].lower()}"
    ctx.declare("test.sleep", "app", {"url": url, "first": host.split(".")[0]}, parent=db)
    if inputs.case == "truthy" and not host:  # case truthy
        raise RuntimeError("unreachable in a plan")
    if inputs.case == "compare":
        try:
            if port == "5432":  # case compare
                ctx.log("default port")
        except Exception:  # a plan's stop is not an Exception: pipeline code cannot swallow it
            ctx.log("swallowed")
    if inputs.case == "length":
        ctx.log(str(len(host)))  # case length
    if inputs.case == "iterate":
        for _ in ctx.step("list", list):  # case iterate
            pass
    if inputs.case == "number":
        ctx.sleep(timedelta(seconds=int(outputs["port"])))  # case number
    if inputs.case == "raise-with":
        raise ValueError(f"bad port {port}")  # case raise-with
    if inputs.case == "raise":
        raise ValueError("plain failure")
    if inputs.case == "forever":
        while True:
            ctx.log("again")
    if inputs.case == "refused":
        inner = ctx.declare("test.sleep", "inner", parent=db)
        ctx.declare("test.sleep", "loop", parent=inner, children=[db])


def test_a_placeholder_passes_on_as_text_and_indexes_deeper() -> None:
    answer = plan(cases)
    assert answer["complete"] is True
    app = next(e for e in answer["entries"] if e.get("ref") == "test.sleep app")
    assert app["spec"] == {
        "url": "postgres://<test.sleep db: outputs.host>:<test.sleep db: outputs.port>/"
        "<test.sleep db: outputs.database.lower()>",
        "first": "<test.sleep db: outputs.host.split('.')[0]>",
    }
    assert app["owner"] == "test.sleep db"
    assert app["uses"] == ["test.sleep db"]
    assert [n["ref"] for n in answer["tree"][0]["children"][0]["children"]] == ["test.sleep app"]


def test_truth_is_assumed_and_noted_with_its_line() -> None:
    answer = plan(cases, {"case": "truthy"})
    assert answer["complete"] is True
    (assumed,) = [e for e in answer["entries"] if e["op"] == "assume"]
    assert assumed["value"] == "<test.sleep db: outputs.host>"
    assert assumed["where"].endswith(f"test_plan_recording.py:{_line('# case truthy')}")


@pytest.mark.parametrize(
    ("case", "placeholder", "what"),
    [
        ("compare", "<test.sleep db: outputs.port>", "compares '5432' with"),
        ("length", "<test.sleep db: outputs.host>", "asks the length of"),
        ("iterate", "<step list: result>", "iterates over"),
        ("number", "<test.sleep db: outputs.port>", "takes as a number"),
    ],
)
def test_needing_a_value_stops_the_plan_where_the_code_needs_it(case: str, placeholder: str, what: str) -> None:
    answer = plan(cases, {"case": case})
    assert answer["complete"] is False
    stopped = answer["stopped"]
    assert stopped["placeholder"] == placeholder
    assert stopped["where"].endswith(f"test_plan_recording.py:{_line(f'# case {case}')}")
    assert f"the pipeline {what} {placeholder}" in stopped["reason"]
    assert all(e.get("message") != "swallowed" for e in answer["entries"])
    assert answer["output"] is None


def test_an_exception_that_carries_a_placeholder_stops_the_plan_and_any_other_fails_it() -> None:
    answer = plan(cases, {"case": "raise-with"})
    assert answer["complete"] is False
    assert answer["stopped"]["placeholder"] == "<test.sleep db: outputs.port>"
    assert answer["stopped"]["where"].endswith(f":{_line('# case raise-with')}")
    with pytest.raises(PlanFailed, match="the pipeline raised ValueError: plain failure"):
        plan(cases, {"case": "raise"})


def test_the_worlds_rules_still_refuse_and_a_plan_without_end_stops() -> None:
    with pytest.raises(
        PlanFailed,
        match=r"ResourceFailed: cannot declare test\.sleep/loop: its own ancestor test\.sleep/db cannot be its child",
    ):
        plan(cases, {"case": "refused"})
    answer = plan(cases, {"case": "forever"}, max_entries=50)
    assert answer["complete"] is False
    assert "more than 50 entries" in answer["stopped"]["reason"]
    assert len(answer["entries"]) == 50


class Nothing(BaseModel):
    pass


def _probe(path: str) -> str:
    import os

    return str(os.path.exists(path))


@pipeline("plan.machines", inputs=Nothing)
def machines(ctx: Context, inputs: Nothing) -> None:
    builder = ctx.agent("builder")
    builder.put_file("/etc/app.conf", "x=1\n", mode=0o600)
    config = builder.get_file("/etc/os-release").decode()
    result = builder.exec(["echo", config], env={"TOKEN": ctx.secret("ci-token")})
    found = builder.run(_probe, "/srv")
    for machine in ctx.select_agents(labels={"pool": "ci"}):
        machine.exec(["uptime", result.stdout_tail, found])
    report = ctx.publish_artifact("report.txt", b"all green\n", keep_for=timedelta(days=1))
    ctx.declare("file", "copy", {"content": report})
    ctx.sleep(timedelta(minutes=5))


def test_agent_calls_artifacts_and_sleeps_are_entries() -> None:
    answer = plan(machines)
    assert answer["complete"] is True
    ops = [(e["op"], e.get("ref") or e.get("target")) for e in answer["entries"]]
    assert ops == [
        ("declare", "agent builder"),
        ("put_file", "agent builder put_file"),
        ("get_file", "agent builder get_file"),
        ("exec", "agent builder exec"),
        ("call", "agent builder call"),
        ("select_agents", "selected agent"),
        ("exec", "selected agent exec"),
        ("publish_artifact", "artifact report.txt"),
        ("declare", "file copy"),
        ("sleep", None),
    ]
    put, _, command, call, selected, other, artifact, copy, pause = answer["entries"][1:]
    assert (put["path"], put["size"], put["mode"]) == ("/etc/app.conf", 4, "0o600")
    assert command["argv"] == ["echo", "<agent builder get_file: content.decode()>"]
    assert command["env"] == {"TOKEN": {"$secret": "ci-token"}}
    assert (call["function"], call["args"]) == ("_probe", ["/srv"])
    assert selected["labels"] == {"pool": "ci"}
    assert other["argv"] == ["uptime", "<agent builder exec: stdout_tail>", "<agent builder call: result>"]
    assert other["uses"] == ["agent builder call", "agent builder exec"]
    assert (artifact["size"], artifact["keep_for"], artifact["stand"]) == (10, 86400, "stand plan.machines")
    assert copy["spec"] == {"content": {"$artifact": "<artifact report.txt: id>"}}
    assert pause["seconds"] == 300
    stand = answer["tree"][1]
    assert (stand["ref"], [n["ref"] for n in stand["children"]]) == ("stand plan.machines", ["artifact report.txt"])
