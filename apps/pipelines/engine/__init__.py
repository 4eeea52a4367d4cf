"""The execution engine: runs a pipeline function by replaying its journal (I5).

``Resource.ready()`` on a record that has not settled, and ``ctx.sleep`` before its time,
*suspend* the run: the worker is released and the run is re-queued when a record it waits
on settles (the records app's ``RecordsSettled`` event) or its timer is due (beat).

* ``journal``: sequence numbers, replay, the fence around every write, and ``act``, the one
  shape of a call that locks the run, calls a service and journals its result.
* ``records``, ``children`` (child runs, artifacts), ``agents`` (machines), ``steps`` (steps,
  timers, logs): the calls of the SDK's ``Runtime`` protocol, by subject.
* ``execution``: ``Execution``, the façade that is the ``Runtime``.
* ``lifecycle``: ``run_execute``, one execution from taking the lease to its end.
"""

from apps.pipelines.engine.execution import Execution
from apps.pipelines.engine.lifecycle import run_execute

__all__ = ["Execution", "run_execute"]
