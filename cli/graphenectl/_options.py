"""Options shared by many commands, so that they read the same everywhere."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from graphenectl._output import Format

OutputOpt = Annotated[
    Format,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table | wide (more columns) | json | yaml (the API's objects) | name (TYPE/ID per line)",
    ),
]
NamespaceOpt = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        "-n",
        metavar="NS",
        help="work in this namespace (default: GRAPHENE_NAMESPACE, else the context's; none chosen: lists show "
        "every namespace you may see, new things go to 'default')",
        show_default=False,
    ),
]
AllNamespacesOpt = Annotated[
    bool,
    typer.Option("--all-namespaces", "-A", help="list every namespace you may see, whatever namespace is chosen"),
]
IntervalOpt = Annotated[
    float,
    typer.Option("--interval", min=0.2, help="seconds between polls while watching or following"),
]


class Severity(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
