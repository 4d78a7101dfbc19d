"""moto's server as the strict AWS runs it (imgest.services.strict_aws): run by the Python of moto's own environment
(``<state>/aws/venv/bin/python strict_aws_server.py -H HOST -p PORT``), never imported by imgest.

One correction to moto 5.2.5 with IAM authentication on: it authenticates STS's AssumeRoleWithWebIdentity and
AssumeRoleWithSAML too, which AWS serves unsigned (the token is the credential; a pod with IRSA has no keys to sign
with), and answers them with a 500 (no Authorization header). Every other request stays authenticated.
"""

from __future__ import annotations

import sys

UNSIGNED_ACTIONS = ("AssumeRoleWithWebIdentity", "AssumeRoleWithSAML")


def main(argv: list[str]) -> None:
    """moto's server with the correction in place."""
    from moto.core import authorization  # the aws venv's moto

    mixin = authorization.ActionAuthenticatorMixin
    authenticate = mixin._authenticate_and_authorize_normal_action

    def unsigned_sts_as_aws(self: object, resource: str = "*") -> None:
        if self._get_action() in UNSIGNED_ACTIONS:  # type: ignore[attr-defined]
            return
        authenticate(self, resource)  # type: ignore[arg-type]

    mixin._authenticate_and_authorize_normal_action = unsigned_sts_as_aws  # type: ignore[method-assign]
    from moto.server import main as serve

    serve(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
