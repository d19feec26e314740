"""What some tests need of the host: system packages, and the grading sandbox."""
import os
import shutil

import pytest


# The Debian/Ubuntu packages some tests need, the program each provides, and what it is for.
# `make test` installs them where it can (root and apt-get); see the Makefile.
SYSTEM_PACKAGES = {
    "bubblewrap": ("bwrap", "the grading sandbox runs student code under bubblewrap"),
    "chromium": ("/usr/bin/chromium", "the browser tests drive the system's Chromium"),
    "acl": ("setfacl", "the course hub lets its accounts into the Python environment with an "
                       "ACL entry"),
}


def require_system_package(package: str) -> str:
    """The path of the program that ``package`` provides. Where it is missing, the calling
    test skips with a reason that names the command installing it; with ``CI`` set it fails
    instead, because CI's ``make test`` installs both packages and a skip would hide the tests.
    """
    program, purpose = SYSTEM_PACKAGES[package]
    found = program if os.path.isabs(program) and os.access(program, os.X_OK) \
        else shutil.which(program) if not os.path.isabs(program) else None
    if found:
        return found
    message = (f"{purpose}, and the system package {package} is not installed "
               f"(to run this test: sudo apt-get install {package})")
    if os.environ.get("CI"):
        pytest.fail(message + "; CI must provide it")
    pytest.skip(message)


def require_grading_sandbox() -> None:
    """Skip (with the command that fixes it) where grading kernels cannot be sandboxed: the
    sandbox switches each kernel to a uid of its own, which needs root, and runs it under
    bubblewrap."""
    if os.geteuid() != 0:
        pytest.skip("the grading sandbox switches the kernel to another uid, which needs root "
                    "(to run this test: sudo make test)")
    require_system_package("bubblewrap")
