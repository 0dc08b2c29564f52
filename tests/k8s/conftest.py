"""Rendered overlays of k8s/, once per session, for the manifest checks and the smoke
test."""

from __future__ import annotations

import pytest

from tests.support.manifests import OVERLAYS, Obj, render


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Obj]]:
    return {overlay: render(overlay) for overlay in OVERLAYS}
