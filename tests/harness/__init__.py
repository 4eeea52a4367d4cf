"""The test suite's harness: one home for what tests start, reach and wait on.

Three layers, chosen per test by what it promises (CONTRIBUTING.md, "Tests"):

* **in-process** — ``driver.Driver`` (the ``drive`` fixture) runs on-commit callbacks and Celery
  tasks in the test's own process until nothing is left: engine semantics (replay, suspend,
  resume, journal) without worker processes.
* **shared processes** — ``processes.SharedWorkers`` and ``web.WebServer`` started once per test
  session (per pytest-xdist worker) for tests that neither kill nor reconfigure them; between
  tests their queue is purged and they are waited on until idle, before the database is flushed.
* **own processes** — ``processes.Worker``, ``web.WebServer``, ``agents.AgentProcess`` started by
  the test itself for every crash, reconnect, lease and parallelism promise.

Modules: ``net`` (free ports, HTTP(S)), ``tls`` (the session's CA and certificate: the web
servers serve HTTPS and WSS, every client trusts that CA), ``wait`` (conditions with deadlines), ``processes``
(the ``Service`` base, Celery workers and beat, the shared pools), ``web`` (daphne, and
``graphene web`` under the production settings), ``embedded`` (``graphene up`` and
graphenectl), ``agents`` (agent processes), ``docker`` (the busybox image, counting labelled
objects), ``driver`` (the in-process driver).
"""
