"""Shared test set-up. Importing rdurack first sets Ray's loopback environment; the
certificates of the security tests (tests/support/certs.py), made once per session."""

from __future__ import annotations

import pytest

import rdurack  # noqa: F401  (sets RAY_* defaults before any test imports ray)
from tests.support.certs import RackCerts, make_rack_certs


@pytest.fixture(scope="session")
def rack_certs(tmp_path_factory: pytest.TempPathFactory) -> RackCerts:
    return make_rack_certs(tmp_path_factory.mktemp("certs"))
