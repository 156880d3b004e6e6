"""What python-nomad's tests import as `tests.common`: where the agent is, and the token.

The ACL tests bootstrap the cluster and store the management token here; the fixtures read it
again for every test, so the tests after them run with it.
"""
import os

IP = os.environ.get("NOMAD_IP", "127.0.0.1")
NOMAD_PORT = os.environ.get("NOMAD_PORT", "4646")
NOMAD_TOKEN = os.environ.get("NOMAD_TOKEN") or None
NOMAD_NAMESPACE = "admin"
