"""graphenectl and namespaces: ``namespace``, ``role`` (bind, unbind, bindings), ``secret``, and
-n / -A / GRAPHENE_NAMESPACE / a context's namespace on lists and creations, against the shared
web server, as a user of the console script sees them (stdout, stderr, exit code).

Runs of ``sample.team-b`` (namespace ``team-b``, tests/pipelines/sample.py) are started and left
queued: nothing here needs them to run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import Group
from graphene_sdk import config as sdk_config
from graphenectl import _cmd_access

from apps.core import access, rbac
from apps.core.models import Namespace, Role, RoleBinding
from apps.pipelines import services
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record
from apps.secrets.models import Secret
from tests import factories
from tests.factories import api_token
from tests.harness.embedded import Ctl, Result
from tests.harness.net import free_port
from tests.harness.web import WebServer

TEAM = "team-b"  # the namespace of sample.team-b


@pytest.fixture
def admin(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser(username="root", password="pw")


@pytest.fixture
def ctl(web: WebServer, admin: Any, tmp_path: Path) -> Ctl:
    """graphenectl as the superuser (GRAPHENE_SERVER and GRAPHENE_TOKEN, no context), on a
    database with what its first migration made (the built-in roles, ``default``), which the
    flush after a transactional test removed."""
    access.builtins_ensure()
    return Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=api_token(admin))


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="bob", password="pw")


def as_user(ctl: Ctl, user: Any) -> dict[str, str]:
    """The environment that makes ``ctl`` act as ``user``."""
    return {"GRAPHENE_TOKEN": api_token(user)}


def dead_server() -> dict[str, str]:
    """A server nothing listens on: a command that sent anything would fail to reach it (exit 1)."""
    return {"GRAPHENE_SERVER": f"https://127.0.0.1:{free_port()}"}


def rows(result: Result) -> list[list[str]]:
    """A table's rows as columns (no cell here holds blanks), the header first."""
    return [line.split() for line in result.out.splitlines() if line.strip()]


def refused(result: Result, code: int) -> str:
    assert result.code == code, result
    assert "Traceback" not in result.err, result.err
    return result.err


# --- what graphenectl knows of the server --------------------------------------------------------


def test_the_rules_words_in_the_help_are_the_servers() -> None:
    assert _cmd_access.VERBS == access.VERBS
    assert _cmd_access.RESOURCES == access.RESOURCES
    assert sdk_config.NAMESPACE_NAME.pattern == rbac.NAME.pattern


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("get,list:runs,records", {"verbs": ["get", "list"], "resources": ["runs", "records"]}),
        ("*:*", {"verbs": ["*"], "resources": ["*"]}),
        ("get, list : runs", {"verbs": ["get", "list"], "resources": ["runs"]}),
        ("get,get:runs", {"verbs": ["get"], "resources": ["runs"]}),
    ],
)
def test_a_rule_on_the_command_line_reads_verbs_colon_resources(text: str, rule: dict[str, list[str]]) -> None:
    assert _cmd_access.parse_rule(text) == rule


# --- namespace -----------------------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_namespaces_are_made_listed_shown_and_deleted(ctl: Ctl) -> None:
    made = ctl.ok("namespace", "create", "cli-made", "--description", "for the CLI's tests")
    assert made.out == "namespace/cli-made\n"
    assert "namespace/cli-made created" in made.err
    assert "graphenectl role bind developer --user USER -n cli-made" in made.err
    assert Namespace.objects.filter(name="cli-made", created_by__username="root").exists()

    listed = ctl.ok("namespace", "list", "-o", "json").json()
    assert [n["name"] for n in listed] == ["cli-made", "default"]  # by name, every page
    assert listed[0]["description"] == "for the CLI's tests"
    table = rows(ctl.ok("namespace", "list"))
    assert table[0] == ["NAME", "DESCRIPTION", "CREATED", "BY", "AGE"]
    assert table[1][0] == "cli-made"
    assert ctl.ok("namespace", "list", "-o", "name").out.split() == ["namespace/cli-made", "namespace/default"]
    one = ctl("namespace", "list", "--limit", "1", "-o", "name")
    assert one.out.split() == ["namespace/cli-made"]
    assert "more exist" in one.err
    assert yaml.safe_load(ctl.ok("namespace", "get", "cli-made", "-o", "yaml").out)["created_by"] == "root"

    # Refusals say why: taken (the server's conflict), a bad name (nothing sent), unknown.
    assert "namespace 'cli-made' already exists" in refused(ctl("namespace", "create", "cli-made"), 1)
    bad = refused(ctl("namespace", "create", "Team_A", env=dead_server()), 2)
    assert "'Team_A' is not a namespace name" in bad
    assert "cannot reach" not in bad
    assert "no namespace 'nope'" in refused(ctl("namespace", "get", "nope"), 3)

    # A namespace that holds something is kept, and the server says what is left.
    ctl.ok("apply", "graphene.stand", "held", "-n", "cli-made")
    holding = refused(ctl("namespace", "delete", "cli-made"), 1)
    assert "namespace 'cli-made' still holds 1 record; delete them first" in holding
    ctl.ok("namespace", "create", "cli-empty")
    assert "namespace/cli-empty deleted" in ctl.ok("namespace", "delete", "cli-empty").err
    assert not Namespace.objects.filter(name="cli-empty").exists()
    assert "cannot be deleted" in refused(ctl("namespace", "delete", "default"), 1)


# --- role ----------------------------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_roles_are_made_from_rules_bound_unbound_and_deleted(ctl: Ctl, bob: Any) -> None:
    factories.bind(bob, "viewer", "cli-made")  # makes the namespace
    made = ctl.ok(
        "role", "create", "ci-runner", "--rule", "get,list:runs,pipelines", "-r", "start:runs", "-d", "starts runs"
    )
    assert made.out == "role/ci-runner\n"
    assert Role.objects.get(name="ci-runner").rules == [
        {"verbs": ["get", "list"], "resources": ["runs", "pipelines"]},
        {"verbs": ["start"], "resources": ["runs"]},
    ]
    names = ctl.ok("role", "list", "-o", "name").out.split()
    assert names == ["role/admin", "role/agent-installer", "role/ci-runner", "role/developer", "role/viewer"]
    wide = ctl.ok("role", "list", "-o", "wide").out
    assert "get,list:runs,pipelines; start:runs" in wide
    developer = ctl.ok("role", "get", "developer").out
    assert re.search(r"^start,cancel,resume\s+runs$", developer, flags=re.M), developer
    assert "Built in:     yes" in developer
    assert ctl.ok("role", "get", "ci-runner", "-o", "json").json() == {
        "name": "ci-runner",
        "description": "starts runs",
        "rules": Role.objects.get(name="ci-runner").rules,
        "is_builtin": False,
    }

    # A rule's syntax is checked before anything is sent (a dead server is never asked); its
    # verbs and resources by the server, whose message lists the known ones.
    for bad, why in [
        ("get,list", "write a rule as VERBS:RESOURCES"),
        ("get:runs:records", "write a rule as VERBS:RESOURCES"),
        ("get,:runs", "verbs must be a comma-separated list of names"),
        ("get:", "resources must be a comma-separated list of names"),
        ("Get:runs", "'Get' cannot be one of the verbs"),
    ]:
        error = refused(ctl("role", "create", "broken", "--rule", "get:runs", "--rule", bad, env=dead_server()), 2)
        assert why in error, (bad, error)
    unknown = refused(ctl("role", "create", "broken", "--rule", "get,frob:runs"), 2)
    assert "unknown verbs ['frob']; known: get, list, watch" in unknown
    assert not Role.objects.filter(name="broken").exists()
    assert "Verbs: get, list, watch" in ctl.ok("role", "create", "--help").out

    # Bind: the binding is printed; binding again says so and changes nothing.
    bound = ctl.ok("role", "bind", "ci-runner", "--user", "bob", "-n", "cli-made")
    assert "bound ci-runner to user/bob in namespace 'cli-made'" in bound.err
    header, row = rows(bound)
    assert header == ["ID", "NAMESPACE", "ROLE", "SUBJECT", "CREATED", "BY", "AGE"]
    binding = RoleBinding.objects.get(role__name="ci-runner")
    assert row[:5] == [str(binding.pk), "cli-made", "ci-runner", "user/bob", "root"]
    again = ctl.ok("role", "bind", "ci-runner", "--user", "bob", "-n", "cli-made", "-o", "json")
    assert again.json()["id"] == binding.pk
    assert f"already bound: ci-runner to user/bob in namespace 'cli-made' (rolebinding/{binding.pk})" in again.err
    assert RoleBinding.objects.filter(role__name="ci-runner").count() == 1
    no_group = ctl("role", "bind", "viewer", "--group", "auditors", "--all-namespaces")
    assert "no group 'auditors'" in refused(no_group, 3)
    Group.objects.create(name="auditors")
    star = ctl.ok("role", "bind", "viewer", "--group", "auditors", "--all-namespaces", "-o", "json").json()
    assert (star["namespace"], star["group"], star["user"]) == ("*", "auditors", None)
    assert "bound" in ctl.ok("role", "bind", "viewer", "--user", "bob", "-o", "name").err  # none chosen: default
    assert RoleBinding.objects.filter(role__name="viewer", user=bob, namespace="default").exists()
    assert "exactly one of --user USER or --group GROUP" in refused(ctl("role", "bind", "viewer"), 2)
    assert "exclude each other" in refused(
        ctl("role", "bind", "viewer", "--user", "bob", "-n", "x", "--all-namespaces", env=dead_server()), 2
    )

    # Bindings: all you may see (with their namespaces), of one namespace, of '*', of one user.
    listed = ctl.ok("role", "bindings", "-o", "json").json()
    assert {(b["role"], b["namespace"]) for b in listed} == {
        ("viewer", "cli-made"),
        ("ci-runner", "cli-made"),
        ("viewer", "*"),
        ("viewer", "default"),
    }
    in_made = rows(ctl.ok("role", "bindings", "-n", "cli-made"))
    assert {r[1] for r in in_made[1:]} == {"cli-made"}
    assert len(in_made) == 3
    assert [b["group"] for b in ctl.ok("role", "bindings", "-n", "*", "-o", "json").json()] == ["auditors"]
    assert len(ctl.ok("role", "bindings", "--user", "bob", "-o", "json").json()) == 3
    assert "rolebinding/" in ctl.ok("role", "bindings", "--limit", "1", "-o", "name").out
    assert "more exist" in ctl("role", "bindings", "--limit", "1").err

    # Unbind, delete; what the server refuses it explains.
    assert "is bound 1 time(s); unbind it first" in refused(ctl("role", "delete", "ci-runner"), 1)
    assert f"rolebinding/{binding.pk} removed" in ctl.ok("role", "unbind", f"rolebinding/{binding.pk}").err
    assert not RoleBinding.objects.filter(pk=binding.pk).exists()
    assert "not a binding id" in refused(ctl("role", "unbind", "abc", env=dead_server()), 2)
    assert f"no role binding {binding.pk}" in refused(ctl("role", "unbind", str(binding.pk)), 3)
    assert "role/ci-runner deleted" in ctl.ok("role", "delete", "ci-runner").err
    assert "built in; it cannot be deleted" in refused(ctl("role", "delete", "admin"), 1)


# --- one user, one namespace ---------------------------------------------------------------------


def _world(bob: Any) -> dict[str, Any]:
    """bob is a developer in team-b only; two runs of sample.team-b and a stand there, one run
    and a stand in default."""
    factories.bind(bob, "developer", TEAM)
    team_runs = [services.run_start(pipeline_name="sample.team-b", inputs={}) for _ in range(2)]
    other_run = services.run_start(pipeline_name="sample.cli", inputs={})
    records.record_create_root(kind="graphene.stand", name="team-things", namespace=TEAM)
    records.record_create_root(kind="graphene.stand", name="default-things")
    return {"team_runs": team_runs, "other_run": other_run}


def _live(namespace: str | None = None) -> set[str]:
    qs = Record.objects.exclude(phase=Phase.DELETED)
    return {str(pk) for pk in (qs.filter(namespace=namespace) if namespace else qs).values_list("pk", flat=True)}


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_user_bound_in_one_namespace_sees_only_its_records_and_runs(ctl: Ctl, bob: Any) -> None:
    world = _world(bob)
    env = as_user(ctl, bob)

    # No namespace chosen: every namespace bob may see, which is team-b, with a NAMESPACE column.
    table = rows(ctl.ok("get", "records", env=env))
    assert table[0][:3] == ["NAMESPACE", "ID", "KIND"]
    assert {r[0] for r in table[1:]} == {TEAM}
    assert {r[1] for r in table[1:]} == _live(TEAM)
    assert len(table) - 1 == 3  # two runs' root records and the stand
    runs = ctl.ok("get", "runs", "-o", "json", env=env).json()
    assert sorted(r["id"] for r in runs) == sorted(str(r.pk) for r in world["team_runs"])
    assert {r["namespace"] for r in runs} == {TEAM}  # -o json: the API's objects, namespaces included
    run_table = rows(ctl.ok("run", "list", env=env))
    assert run_table[0][:3] == ["NAMESPACE", "ID", "PIPELINE"]
    assert [r[0] for r in run_table[1:]] == [TEAM, TEAM]
    assert {p["name"] for p in ctl.ok("get", "pipelines", "-o", "json", env=env).json()} == {"sample.team-b"}

    # -n: that namespace, no NAMESPACE column; where bob holds no binding, the server's refusal.
    narrowed = rows(ctl.ok("get", "records", "-n", TEAM, env=env))
    assert narrowed[0][:2] == ["ID", "KIND"]
    assert {r[0] for r in narrowed[1:]} == _live(TEAM)
    denied = refused(ctl("get", "runs", "-n", "default", env=env), 1)
    assert "bob may not list runs in namespace 'default': no role bound to them there grants it" in denied
    assert "graphenectl role bind ROLE --user bob -n default" in denied

    # The superuser sees both namespaces, each row saying whose it is.
    everything = rows(ctl.ok("get", "runs"))
    assert sorted(r[0] for r in everything[1:]) == sorted([TEAM, TEAM, "default"])
    assert {r[0] for r in rows(ctl.ok("get", "records"))[1:]} == {TEAM, "default"}
    assert len(rows(ctl.ok("get", "records"))) - 1 == len(_live())
    assert [r["id"] for r in ctl.ok("get", "runs", "-n", "default", "-o", "json").json()] == [
        str(world["other_run"].pk)
    ]


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_stands_are_listed_by_namespace(ctl: Ctl, bob: Any) -> None:
    factories.bind(bob, "developer", TEAM)
    services.pipelines_sync_all()
    team = services.stand_get("sample.team-b", namespace=TEAM)
    mine = services.stand_get("sample.cli")

    # None chosen: every namespace, a NAMESPACE column first; -n: that one, the column in -o wide.
    table = rows(ctl.ok("stand", "list"))
    assert table[0] == ["NAMESPACE", "PIPELINE", "ID", "HOLDINGS", "RECORDS"]
    assert [r[:3] for r in table[1:]] == [
        ["default", "sample.cli", str(mine.pk)],
        [TEAM, "sample.team-b", str(team.pk)],
    ]
    narrowed = rows(ctl.ok("stand", "list", "-n", TEAM))
    assert narrowed == [["PIPELINE", "ID", "HOLDINGS", "RECORDS"], ["sample.team-b", str(team.pk), "0", "0"]]
    assert rows(ctl.ok("stand", "list", "-n", TEAM, "-o", "wide"))[1][-1] == TEAM
    in_team = {"GRAPHENE_NAMESPACE": TEAM}
    assert [s["id"] for s in ctl.ok("stand", "list", "-o", "json", env=in_team).json()] == [str(team.pk)]
    assert [s["namespace"] for s in ctl.ok("stand", "list", "-A", "-o", "json", env=in_team).json()] == [
        "default",
        TEAM,
    ]
    assert [s["id"] for s in ctl.ok("-n", "default", "stand", "list", "-o", "json").json()] == [str(mine.pk)]
    # `get stands` lists the same way.
    assert rows(ctl.ok("get", "stands"))[0][0] == "NAMESPACE"
    assert [s["namespace"] for s in ctl.ok("get", "stands", "-n", TEAM, "-o", "json").json()] == [TEAM]
    assert re.search(rf"^Namespace:\s+{TEAM}$", ctl.ok("describe", "stand/sample.team-b").out, flags=re.M)
    ctl.ok("namespace", "create", "quiet")
    assert "no stands yet in namespace 'quiet'" in ctl.ok("stand", "list", "-n", "quiet").err
    assert "exclude each other" in refused(ctl("stand", "list", "-n", TEAM, "-A", env=dead_server()), 2)

    # bob, a developer of team-b: team-b's stands, chosen or not; refused elsewhere.
    env = as_user(ctl, bob)
    assert [s["pipeline"] for s in ctl.ok("stand", "list", "-o", "json", env=env).json()] == ["sample.team-b"]
    denied = refused(ctl("stand", "list", "-n", "default", env=env), 1)
    assert "bob may not list stands in namespace 'default'" in denied


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_the_namespace_comes_from_the_flag_the_environment_or_the_context(
    ctl: Ctl, bob: Any, web: WebServer, admin: Any, tmp_path: Path
) -> None:
    world = _world(bob)
    team = sorted(str(r.pk) for r in world["team_runs"])
    other = [str(world["other_run"].pk)]

    def run_ids(result: Result) -> list[str]:
        return sorted(r["id"] for r in result.json())

    # GRAPHENE_NAMESPACE narrows; -n wins over it; -A (or -n '*') lists every namespace.
    in_team = {"GRAPHENE_NAMESPACE": TEAM}
    assert run_ids(ctl.ok("get", "runs", "-o", "json", env=in_team)) == team
    assert rows(ctl.ok("get", "runs", env=in_team))[0][0] == "ID"
    assert run_ids(ctl.ok("get", "runs", "-n", "default", "-o", "json", env=in_team)) == other
    assert run_ids(ctl.ok("-n", "default", "get", "runs", "-o", "json", env=in_team)) == other  # before the command
    assert run_ids(ctl.ok("-n", "default", "get", "runs", "-n", TEAM, "-o", "json")) == team  # the command's wins
    assert len(ctl.ok("get", "runs", "-A", "-o", "json", env=in_team).json()) == 3
    assert rows(ctl.ok("get", "runs", "-A", env=in_team))[0][0] == "NAMESPACE"
    assert len(ctl.ok("get", "runs", "-n", "*", "-o", "json", env=in_team).json()) == 3
    assert "exclude each other" in refused(ctl("get", "runs", "-n", TEAM, "-A", env=dead_server()), 2)
    bad = refused(ctl("get", "runs", "-n", "Team_A", env=dead_server()), 2)
    assert "--namespace 'Team_A' is not a namespace name" in bad
    assert "GRAPHENE_NAMESPACE 'x y' is not a namespace name" in refused(
        ctl("get", "runs", env={**dead_server(), "GRAPHENE_NAMESPACE": "x y"}), 2
    )

    # A context remembers a namespace: at login, or with ctx set-namespace; checked with the server.
    token = api_token(admin)
    home = Ctl(tmp_path / "home")
    ca = str(web.ca_file)
    assert "no namespace 'nope'" in refused(
        home("login", "--server", web.url, "--ca-file", ca, "--token-stdin", "--namespace", "nope", stdin=token), 3
    )
    assert not (tmp_path / "home" / "graphene" / "config.yaml").exists(), "nothing was saved"
    logged = home.ok(
        "login", "--server", web.url, "--ca-file", ca, "--token-stdin", "--name", "here", "-n", TEAM, stdin=token
    )
    assert f"namespace '{TEAM}'" in logged.err
    assert run_ids(home.ok("get", "runs", "-o", "json")) == team
    shown = home.ok("ctx", "show", "-o", "json").json()
    assert (shown["namespace"], shown["namespace_from"]) == (TEAM, "context 'here'")
    assert home.ok("ctx", "list", "-o", "json").json()[0]["namespace"] == TEAM
    over = home.ok("ctx", "show", "-o", "json", env={"GRAPHENE_NAMESPACE": "default"}).json()
    assert (over["namespace"], over["namespace_from"], over["environment_overrides"]) == (
        "default",
        "GRAPHENE_NAMESPACE",
        ["GRAPHENE_NAMESPACE"],
    )
    assert run_ids(home.ok("get", "runs", "-o", "json", env={"GRAPHENE_NAMESPACE": "default"})) == other
    assert run_ids(home.ok("get", "runs", "-n", "default", "-o", "json")) == other
    assert len(home.ok("get", "runs", "-A", "-o", "json").json()) == 3

    assert "no namespace 'nope'" in refused(home("ctx", "set-namespace", "nope"), 3)
    assert home.ok("ctx", "show", "-o", "json").json()["namespace"] == TEAM, "nothing was saved"
    assert "works in namespace 'default'" in home.ok("ctx", "set-namespace", "default").err
    assert run_ids(home.ok("get", "runs", "-o", "json")) == other
    assert "chooses no namespace" in home.ok("ctx", "set-namespace", "--unset").err
    assert len(home.ok("get", "runs", "-o", "json").json()) == 3
    assert "give a namespace, or --unset" in refused(home("ctx", "set-namespace"), 2)

    # The file: a context without a namespace reads as none chosen (files from before namespaces).
    config = tmp_path / "home" / "graphene" / "config.yaml"
    saved = yaml.safe_load(config.read_text())
    assert "namespace" not in saved["contexts"][0]
    home.ok("ctx", "set-namespace", TEAM)
    saved = yaml.safe_load(config.read_text())
    assert saved["contexts"][0]["namespace"] == TEAM
    del saved["contexts"][0]["namespace"]
    config.write_text(yaml.safe_dump(saved))
    assert home.ok("ctx", "list", "-o", "json").json()[0]["namespace"] is None
    assert len(home.ok("get", "runs", "-o", "json").json()) == 3


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_creations_go_to_the_namespace_chosen_else_default(ctl: Ctl, bob: Any) -> None:
    factories.bind(bob, "developer", TEAM)
    env = as_user(ctl, bob)

    # A stand root, as bob: in team-b when chosen; in default (where bob may not) when not.
    stand = ctl.ok("apply", "graphene.stand", "bobs", "-n", TEAM, "-o", "json", env=env).json()
    assert (stand["namespace"], Record.objects.get(pk=stand["id"]).namespace) == (TEAM, TEAM)
    denied = refused(ctl("apply", "graphene.stand", "bobs-too", env=env), 1)
    assert "bob may not create stands in namespace 'default'" in denied
    assert not Record.objects.filter(name="bobs-too").exists()
    assert "acts in one" in refused(ctl("apply", "graphene.stand", "x", "-n", "*", env=dead_server()), 2)
    # A record lives in its owner's namespace; a pipeline's stand, made as an owner, in the pipeline's.
    held = ctl.ok("apply", "test.sleep", "box", "--owner", "stand/sample.team-b", "-o", "json", env=env).json()
    assert held["namespace"] == TEAM
    assert Record.objects.get(kind="graphene.stand", name="sample.team-b").namespace == TEAM

    # A run starts in its pipeline's namespace, whatever is chosen; graphenectl says so.
    started = ctl("-n", TEAM, "run", "start", "sample.cli", "-o", "json")
    assert started.code == 0, started
    assert "pipeline 'sample.cli' lives in namespace 'default' (its code says so); the run starts there" in started.err
    assert started.json()["namespace"] == "default"

    # A secret, as bob: set from stdin in team-b, listed with its namespace, never its value.
    made = ctl.ok("secret", "set", "db-password", "-n", TEAM, stdin="s3cret\n", env=env)
    assert made.out == "secret/db-password\n"
    assert f"secret/db-password created in namespace '{TEAM}'" in made.err
    assert Secret.objects.get(name="db-password").namespace == TEAM
    assert "replaced" in ctl.ok("secret", "set", "db-password", "-n", TEAM, stdin="other", env=env).err
    listed = rows(ctl.ok("secret", "list", env=env))
    assert listed[0][:2] == ["NAMESPACE", "NAME"]
    assert listed[1][:2] == [TEAM, "db-password"]
    shown = ctl.ok("secret", "get", "db-password", "-n", TEAM, "-o", "json", env=env).json()
    assert (shown["namespace"], shown["updated_by"]) == (TEAM, "bob")
    assert "s3cret" not in str(shown)
    assert "no secret" in refused(ctl("secret", "get", "db-password"), 3).lower()  # default holds none
    assert "the value is empty" in refused(ctl("secret", "set", "empty", "-n", TEAM, stdin="", env=env), 2)
    assert "not a valid secret name" in refused(ctl("secret", "set", "no/pe", stdin="x", env=dead_server()), 2)
    assert "deleted" in ctl.ok("secret", "delete", "db-password", "-n", TEAM, env=env).err
    assert not Secret.objects.filter(name="db-password").exists()

    # An agent, as the superuser (developers enroll none): its record in the namespace chosen.
    ctl.ok("agent", "create", "team-box", "-n", TEAM)
    agent = Record.objects.get(kind="agent", name="team-box")
    assert agent.namespace == TEAM
    assert agent.parent is not None
    assert (agent.parent.name, agent.parent.namespace) == ("agents", TEAM)
    assert [a["name"] for a in ctl.ok("get", "agents", "-n", TEAM, "-o", "json").json()] == ["team-box"]
    assert ctl.ok("get", "agents", "-n", "default", "-o", "json").json() == []
