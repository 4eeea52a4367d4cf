"""Git for Graphene: the ``git.checkout`` kind and the actions behind ``graphene_sdk.libs.git``.

Everything runs the ``git`` command line (see README.md for why not dulwich); ``cli`` is the
one place a git process is started, with credentials passed through its environment.
"""
