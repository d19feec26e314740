"""The course hub's log-in: hub-only passwords, stored hashed.

``HashedPasswordAuthenticator`` checks a user name and password against ``accounts.json``
(mode 0600, readable by the hub's root process only): one PBKDF2-SHA256 hash with its own
salt per account.  The system accounts the servers run as stay locked (no password, no
shell), so a hub password opens the hub and nothing else on the machine.  An institution
swaps this class for its own single sign-on (``oauthenticator``, ``ldapauthenticator``, ...).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets

from jupyterhub.auth import Authenticator
from traitlets import Unicode

ITERATIONS = 200_000


def hash_password(password: str, salt: str | None = None, iterations: int = ITERATIONS) -> str:
    """``pbkdf2_sha256$ITERATIONS$SALT$HEX``."""
    salt = salt or secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"pbkdf2_sha256${iterations}${salt}${digest.hex()}"


def check_password(password: str, stored: str) -> bool:
    try:
        method, iterations, salt, _ = stored.split("$")
    except ValueError:
        return False
    if method != "pbkdf2_sha256":
        return False
    return hmac.compare_digest(hash_password(password, salt, int(iterations)), stored)


class HashedPasswordAuthenticator(Authenticator):
    accounts_file = Unicode(help="JSON file {user: hash} (mode 0600)").tag(config=True)

    def _accounts(self) -> dict:
        mode = os.stat(self.accounts_file).st_mode & 0o777
        if mode & 0o077:
            raise PermissionError(f"{self.accounts_file} is mode {mode:o}; it must be 0600")
        with open(self.accounts_file) as fh:
            return json.load(fh)

    async def authenticate(self, handler, data):
        user = (data or {}).get("username", "")
        password = (data or {}).get("password", "")
        stored = self._accounts().get(user)
        if stored and check_password(password, stored):
            return user
        self.log.warning("failed log-in for %r", user)
        return None
