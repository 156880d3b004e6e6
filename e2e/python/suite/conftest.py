"""The fixtures python-nomad's tests ask for: a client of the agent in tests.common."""
import nomad
import pytest

import tests.common as common


def _client(**extra):
    return nomad.Nomad(host=common.IP, port=common.NOMAD_PORT, verify=False, token=common.NOMAD_TOKEN, **extra)


@pytest.fixture
def nomad_setup():
    return _client()


@pytest.fixture
def nomad_setup_with_namespace():
    return _client(namespace=common.NOMAD_NAMESPACE)
