"""JupyterHub configuration of the course hub (``make hub``; ``scripts/hub/hub.py`` writes the
state it reads).

One machine, root-run hub:
- log-in: ``HashedPasswordAuthenticator`` (scripts/hub/hub_auth.py), hub-only passwords;
- servers: ``LocalProcessSpawner`` (with per-user limits: hub_limits.py), each user's
  JupyterLab as that user's own system account, in a home folder of mode 0700: a student
  cannot read another student's files, and the course folder (gradebook, sources with
  solutions) is shared with the instructor alone;
- everything listens on 127.0.0.1: the proxy's public and API ports, the hub's own port, the
  single-user servers;
- secrets (cookie secret, proxy token) come from ``secrets.json`` (0600, root).
"""
import json
import os
import sys
from pathlib import Path

STATE = Path(os.environ["MSDA_HUB_STATE"])
SETTINGS = json.loads((STATE / "settings.json").read_text())
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

c = get_config()  # noqa: F821  (provided by JupyterHub)


def _secrets():
    path = STATE / "secrets.json"
    if os.stat(path).st_mode & 0o077:
        raise PermissionError(f"{path} must be mode 0600")
    return json.loads(path.read_text())


SECRETS = _secrets()
HOST = "127.0.0.1"

# ---------------------------------------------------------------- network: loopback only
c.JupyterHub.bind_url = f"http://{HOST}:{SETTINGS['port']}"
c.JupyterHub.hub_bind_url = f"http://{HOST}:{SETTINGS['hub_port']}"
c.ConfigurableHTTPProxy.api_url = f"http://{HOST}:{SETTINGS['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [str(HERE / "node_modules" / ".bin" /
                                       "configurable-http-proxy")]
c.ConfigurableHTTPProxy.auth_token = SECRETS["proxy_token"]
c.ConfigurableHTTPProxy.should_start = True
c.ConfigurableHTTPProxy.pid_file = str(STATE / "hub" / "proxy.pid")
c.JupyterHub.cookie_secret = bytes.fromhex(SECRETS["cookie_secret"])
c.JupyterHub.db_url = f"sqlite:///{STATE / 'hub' / 'jupyterhub.sqlite'}"
c.JupyterHub.pid_file = str(STATE / "hub" / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True          # stopping the hub stops every user's server
c.JupyterHub.cleanup_proxy = True
c.JupyterHub.shutdown_on_logout = False
c.JupyterHub.log_level = SETTINGS.get("log_level", "INFO")

# ---------------------------------------------------------------- who may log in
c.JupyterHub.authenticator_class = "hub_auth.HashedPasswordAuthenticator"
c.HashedPasswordAuthenticator.accounts_file = str(STATE / "accounts.json")
c.Authenticator.allowed_users = set([SETTINGS["instructor"], *SETTINGS["students"]])

# ---------------------------------------------------------------- the users' servers
# LocalProcessSpawner with per-user limits (scripts/hub/hub_limits.py: cgroups where the
# host lets root make them, rlimits always)
c.JupyterHub.spawner_class = "hub_limits.LimitedSpawner"
LIMITS = SETTINGS.get("limits", {})
c.Spawner.mem_limit = f"{LIMITS.get('memory_mb', 4096)}M"
c.Spawner.cpu_limit = float(LIMITS.get("cpus", 1.0))
c.LimitedSpawner.max_processes = int(LIMITS.get("processes", 512))
c.LimitedSpawner.max_file_mb = int(LIMITS.get("file_mb", 2048))
c.LimitedSpawner.slice_name = SETTINGS.get("cgroup_slice", "msda-hub")
c.Spawner.cmd = [str(Path(SETTINGS["venv_bin"]) / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 180                # a loaded 2-core host starts JupyterLab slowly
c.Spawner.http_timeout = 180
c.Spawner.ip = HOST
c.Spawner.environment = {
    "PATH": f"{SETTINGS['venv_bin']}:/usr/local/bin:/usr/bin:/bin",
    # the course's packages (source_kernels for the labs, autograde for the checks and the
    # instructor) come from the environment's install (pip install -e . in make setup)
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
}


def _per_role(spawner):
    """Students: their home folder, nbgrader's student extensions only.  The instructor:
    the course folder, every nbgrader extension (formgrader included)."""
    role = "instructor" if spawner.user.name == SETTINGS["instructor"] else "student"
    spawner.environment["JUPYTER_CONFIG_PATH"] = str(STATE / "config" / role)
    if role == "instructor":
        spawner.notebook_dir = SETTINGS["course"]
        # nbconvert's templates look here first: the formgrader's MathJax macro, local
        spawner.environment["JUPYTER_PATH"] = str(STATE / "data" / role)
    else:
        spawner.notebook_dir = "~"


c.Spawner.pre_spawn_hook = _per_role
