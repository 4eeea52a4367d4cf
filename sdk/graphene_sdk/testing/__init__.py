"""Test pipelines in-process, against an in-memory world with a virtual clock.

    from datetime import timedelta
    from graphene_sdk.testing import World

    def test_environment_is_cleaned_up() -> None:
        world = World()
        result = world.run(integration, Inputs(branch="dev"))
        assert result.status == "succeeded"
        world.assert_no_leaks()
        db = result.record("db")
        world.assert_owner(db, "stand:integration")
        world.advance(hours=5)
        assert db.phase == "deleted"

The world mirrors the ownership rules of the real system: every record has exactly one
owner (a run, another record or a pipeline's stand); when a run ends, whatever it still owns
is deleted, children first; ``ctx.to_stand`` gives a subtree to the pipeline's stand with an
optional TTL, and a TTL running out deletes that subtree. Kinds are simulated generically
(``World.kind``, ``World.on_create``); steps run directly; ``ctx.sleep``, step retries and
slow kinds move the virtual clock instead of waiting. No server, database or network.
Agents' machines are simulated too: ``exec`` answers through ``World.on_exec``,
``put_file``/``get_file`` use an in-memory file system per agent (``world.files``), and
``agent.run`` runs the function's source in this process as the machine would
(``World.on_call`` replaces that).

What is *not* simulated: crashes and replay (so ``at_most_once`` never yields
``OutcomeUnknown``), drift, failing deletions, cancellation and the concurrency policies
between runs (``world.run`` runs one run at a time, to its end; ``run_all`` runs its
children one after another, which honours any ``concurrency`` limit).
"""

# The kit lives in private modules: _results (what a run leaves), _records (the ownership
# rules), _machines (agents and their machines), _world (World) and _runtime (what a run's
# Context calls). Besides ``__all__``, the handler types and ``run_source`` stay importable
# from here, as they were when the kit was one module.
from graphene_sdk.testing._machines import CallFn as CallFn
from graphene_sdk.testing._machines import ExecFn as ExecFn
from graphene_sdk.testing._machines import run_source as run_source
from graphene_sdk.testing._records import OutputsFn as OutputsFn
from graphene_sdk.testing._results import LogLine, Phase, Record, RunResult, RunStatus
from graphene_sdk.testing._world import HandleLike as HandleLike
from graphene_sdk.testing._world import OwnerLike as OwnerLike
from graphene_sdk.testing._world import World

__all__ = ["LogLine", "Phase", "Record", "RunResult", "RunStatus", "World"]
