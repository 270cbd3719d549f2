"""The two seams the tier stands on: production implementations and the tests' fakes alike."""

from __future__ import annotations

from x402 import x402FacilitatorSync
from x402.http import FacilitatorConfig, HTTPFacilitatorClient

from payments.facilitator_port import FacilitatorPort
from payments.processor import ThreadedFacilitator
from skills.models.upstream import UpstreamClient
from skills.models.upstream_port import Upstream
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_facilitator import ScriptedFacilitator


def test_every_facilitator_is_a_facilitator_port() -> None:
    threaded = ThreadedFacilitator(x402FacilitatorSync(), workers=1)
    try:
        for facilitator in (threaded, HTTPFacilitatorClient(FacilitatorConfig(url="http://unused.invalid")),
                            ScriptedFacilitator()):
            assert isinstance(facilitator, FacilitatorPort), type(facilitator).__name__
    finally:
        threaded.close()


def test_the_upstream_client_and_the_fake_are_upstreams() -> None:
    assert isinstance(UpstreamClient(), Upstream)
    assert isinstance(FakeUpstream(), Upstream)
