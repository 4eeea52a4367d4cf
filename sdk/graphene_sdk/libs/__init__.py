"""Resource libraries: typed wrappers over ``Context.declare`` for each family of kinds.

Each module builds a kind's spec from keyword arguments and declares it, returning the
``Resource`` handle; nothing here talks to the outside world itself::

    from graphene_sdk.libs import docker

    net = docker.network(ctx, "net")
    db = docker.container(ctx, "db", image="postgres:16", network=net, ready_when="healthy", ...)
"""
