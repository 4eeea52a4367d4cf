"""A plan (``POST pipelines/{name}/plan/``) as text or as a Mermaid flowchart.

Text: the tree of what the run would own (the run, its child runs, the stands), then the
calls it would make, numbered in order, a child run's calls under it. Mermaid: a ``flowchart``
whose solid arrows are ownership (owner → owned) and dotted arrows are dependencies (a value
read from one call flows into another: ``uses``), with steps and agent calls as nodes of
their own.
"""

from __future__ import annotations

from typing import Any

from graphene_sdk._plan_text import compact as _compact
from graphene_sdk._plan_text import entry_text as call_line
from rich.text import Text
from rich.tree import Tree

from graphenectl._resources import short_digest

# Entries that are nodes of a Mermaid chart besides the tree's: what a run does, not owns.
_ACTIONS = {"step", "exec", "call", "put_file", "get_file"}


def headline(plan: dict[str, Any]) -> str:
    where = f"revision {short_digest(plan['revision'])}" if plan.get("revision") else "code installed on the workers"
    return f"plan of {plan['pipeline']} ({where}, namespace {plan['namespace']}) with inputs {_compact(plan['inputs'])}"


def _label(node: dict[str, Any]) -> Text:
    kind = node["kind"]
    if kind == "graphene.run":
        text = Text("run " if node["ref"] == "run" else "child run ", style="dim") + Text(node["name"], style="bold")
    elif kind == "graphene.stand":
        text = Text("stand ", style="dim") + Text(node["name"], style="bold")
    else:
        text = Text(f"{kind}/{node['name']}")
    if node.get("protect"):
        text.append("  protected", style="yellow")
    if node.get("deleted"):
        text.append("  deleted by the run", style="dim")
    return text


def tree(plan: dict[str, Any]) -> list[Tree]:
    def add(branch: Tree, node: dict[str, Any]) -> None:
        for child in node.get("children", []):
            add(branch.add(_label(child)), child)

    roots = []
    for node in plan["tree"]:
        root = Tree(_label(node), guide_style="dim")
        add(root, node)
        roots.append(root)
    return roots


def calls(plan: dict[str, Any]) -> list[str]:
    lines = []
    for entry in plan["entries"]:
        depth = 0 if entry["run"] == "run" else 1
        text = call_line(entry).replace("\n", "\n" + "   " * depth + "     ")
        prefix = "   " * depth + f"{entry['seq']:>3}  "
        if depth:
            text = f"[{entry['run']}] {text}"
        lines.append(prefix + text)
    return lines


def stopped_line(plan: dict[str, Any]) -> str:
    stopped = plan["stopped"] or {}
    return f"the plan is incomplete: {stopped.get('reason', 'it stopped early')}"


# --- Mermaid --------------------------------------------------------------------------------------


def _quoted(text: str) -> str:
    return '"' + text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;") + '"'


def mermaid(plan: dict[str, Any]) -> str:
    ids: dict[str, str] = {}
    lines = ["flowchart TD"]

    def node_id(ref: str) -> str:
        if ref not in ids:
            ids[ref] = f"n{len(ids) + 1}"
        return ids[ref]

    def walk(node: dict[str, Any], owner: str | None) -> None:
        me = node_id(node["ref"])
        if node["kind"] == "graphene.run":
            shape = f"([{_quoted(('run ' if node['ref'] == 'run' else 'child run ') + node['name'])}])"
        elif node["kind"] == "graphene.stand":
            shape = f"[({_quoted('stand ' + node['name'])})]"
        else:
            shape = f"[{_quoted(node['kind'] + '/' + node['name'])}]"
        lines.append(f"  {me}{shape}")
        if owner is not None:
            lines.append(f"  {owner} --> {me}")
        for child in node.get("children", []):
            walk(child, me)

    for root in plan["tree"]:
        walk(root, None)
    for entry in plan["entries"]:
        if entry["op"] in _ACTIONS:
            me = node_id(entry["ref"])
            lines.append(f"  {me}[[{_quoted(entry['ref'])}]]")
            lines.append(f"  {node_id(entry['run'])} -.- {me}")
    for entry in plan["entries"]:
        target = entry.get("ref")
        if target in ids:
            for used in entry.get("uses", []):
                if used in ids and used != target:
                    lines.append(f"  {ids[used]} -. uses .-> {ids[target]}")
    return "\n".join(dict.fromkeys(lines))  # a record declared again is one node
