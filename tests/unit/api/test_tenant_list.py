"""`GET /v1/tenants`' join of the window's reports, the live loads, the pauses and the client
limits (`dispatch.api.routes.tenants.tenant_list`), without a node."""

from __future__ import annotations

from dispatch.api.routes.tenants import Tenant, tenant_list
from dispatch.core.queries import ClientLoad, ClientLoads
from dispatch.settings import TenantSettings


def test_a_limited_client_is_listed_with_its_limit_even_without_jobs() -> None:
    loads = ClientLoads({("acme", "a.b"): ClientLoad(queued=2, running=1)}, visited=3)
    limit = {"max_inflight": 1, "rate": 2.5, "burst": 3, "source": "runtime"}
    listed = tenant_list({}, loads, TenantSettings(), frozenset({"paused-co"}),
                         {"idle-co": limit, "acme": {**limit, "source": "settings"}})  # fmt: skip
    by_id = {tenant["client_id"]: tenant for tenant in listed}
    assert sorted(by_id) == ["acme", "idle-co", "paused-co"]
    assert by_id["idle-co"]["limit"] == limit and by_id["idle-co"]["queued"] == 0
    assert by_id["acme"]["limit"]["source"] == "settings" and by_id["acme"]["running"] == 1
    assert by_id["paused-co"]["limit"] is None and by_id["paused-co"]["paused"]
    for tenant in listed:
        Tenant.model_validate(tenant)  # the response model takes each
