"""The free catalogue: the 12 resources with exact prices, paging, filters and bounds."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest

from payments.money import usd_to_atomic
from tests.support.live_server import LiveServer

SPEC = {
    "token-attention-report": (["Search"], "0.0575"),
    "token-count-508": (["Llm"], "0.00575"),
    "restaurant-menu-image-generate": (["Image"], "0.0115"),
    "restaurant-review-sentiment": (["Finance"], "0.0115"),
    "v1beta1-tgm-historical-token-quant-scores": (["Blockchain"], "0.0115"),
    "v1beta1-smart-money-historical-token-balances": (["Blockchain"], "0.0115"),
    "v1beta1-token-screener-historical": (["Blockchain"], "0.0115"),
    "v1beta1-tgm-historical-token-ohlcv": (["Blockchain"], "0.0115"),
    "webhook-test-payload": (["Developer", "General"], "0.062101"),
    "error-explain": (["General"], "0.062101"),
    "release-notes-generate": (["Finance", "Developer"], "0.03726"),
    "changelog-generate": (["Developer"], "0.03726"),
}


def get(server: LiveServer, query: str = "") -> httpx.Response:
    return httpx.get(f"{server.url}/api/marketplace/apis{query}")


def test_lists_the_twelve_resources_with_exact_prices_and_categories(server: LiveServer) -> None:
    r = get(server)
    assert r.status_code == 200 and "PAYMENT-REQUIRED" not in r.headers
    assert r.headers["server-timing"].startswith("total;dur=")
    body = r.json()
    assert body["success"] is True
    data = body["data"]
    assert data["total"] == 12 and data["page"] == 1 and data["page_size"] == 50
    items = {i["resource_id"]: i for i in data["items"]}
    assert set(items) == set(SPEC)
    for rid, (cats, price) in SPEC.items():
        item = items[rid]
        assert item["categories"] == cats and item["category"] == ", ".join(cats)
        assert item["display_price"] == f"${price}" and item["price_usd"] == price
        assert item["method"] == "POST" and item["name"] and item["description"]
    assert {c["category"]: c["count"] for c in data["categories"]} == {
        "Blockchain": 4, "Developer": 3, "Finance": 2, "General": 2, "Image": 1, "Llm": 1,
        "Search": 1,
    }


def test_every_listed_id_is_invocable_and_quoted_at_its_price(server: LiveServer) -> None:
    quoted = set()
    for item in get(server).json()["data"]["items"]:
        r = httpx.post(f"{server.url}/v1/marketplace/api/{item['resource_id']}", json={})
        if r.status_code == 503:  # its upstream is not configured here: it says which key enables it
            assert "_API_KEY to enable it" in r.json()["error"]["message"], item["resource_id"]
            continue
        assert r.status_code == 402, item["resource_id"]
        atomic = usd_to_atomic(Decimal(item["price_usd"]))
        assert {a["maxAmountRequired"] for a in r.json()["accepts"]} == {str(atomic)}
        quoted.add(item["resource_id"])
    assert "token-count-508" in quoted  # needs no key: always sold
    assert usd_to_atomic(Decimal("0.062101")) == 62101


@pytest.mark.parametrize("category", ["developer", "DEVELOPER", "Developer"])
def test_category_filter_is_case_insensitive_and_multi_label(server: LiveServer, category: str) -> None:
    data = get(server, f"?category={category}").json()["data"]
    assert data["total"] == 3
    assert {i["resource_id"] for i in data["items"]} == {
        "webhook-test-payload", "release-notes-generate", "changelog-generate"}


@pytest.mark.parametrize("param", ["keyword", "q"])
def test_keyword_and_q_match_id_name_description(server: LiveServer, param: str) -> None:
    data = get(server, f"?{param}=RESTAURANT").json()["data"]
    assert {i["resource_id"] for i in data["items"]} == {
        "restaurant-menu-image-generate", "restaurant-review-sentiment"}
    assert data["total"] == 2
    data = get(server, f"?{param}=smart-money").json()["data"]
    assert [i["resource_id"] for i in data["items"]] == ["v1beta1-smart-money-historical-token-balances"]
    assert get(server, f"?{param}=nothing-like-this").json()["data"]["total"] == 0


def test_paging_total_counts_filtered_set_and_past_the_end_is_empty(server: LiveServer) -> None:
    pages = [get(server, f"?page={p}&page_size=5").json()["data"] for p in (1, 2, 3, 4)]
    assert [len(p["items"]) for p in pages] == [5, 5, 2, 0]
    assert all(p["total"] == 12 and p["page_size"] == 5 for p in pages)
    ids = [i["resource_id"] for p in pages for i in p["items"]]
    assert len(ids) == len(set(ids)) == 12
    data = get(server, "?category=blockchain&page=2&page_size=3").json()["data"]
    assert data["total"] == 4 and len(data["items"]) == 1
    assert get(server, "?page_size=1000").json()["data"]["page_size"] == 100


@pytest.mark.parametrize(
    "query", ["?page=0", "?page=-1", "?page=abc", "?page_size=0", "?page_size=x", "?page=1.5"]
)
def test_bad_paging_is_400_naming_the_parameter(server: LiveServer, query: str) -> None:
    r = get(server, query)
    assert r.status_code == 400
    name = query[1:].split("=")[0]
    body = r.json()
    assert body["success"] is False
    assert body["error"]["param"] == name and name in body["error"]["message"]
