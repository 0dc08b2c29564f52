"""rdurack: an emulated rack of SN40L-style RDU sockets.

Ray reads its environment when it is imported, and without these settings it binds to
every interface and sends usage statistics. rdurack must stay on loopback, so importing
rdurack sets them (as defaults: a user's own values win) before any module imports Ray.
Child processes rdurack starts get them explicitly (processes/local_rack.py).
"""

import os as _os

RAY_ENVIRONMENT = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep Ray's sockets on loopback
    "RAY_USAGE_STATS_ENABLED": "0",  # send nothing out
    "RAY_AUTH_MODE": "disabled",
}
for _key, _value in RAY_ENVIRONMENT.items():
    _os.environ.setdefault(_key, _value)
