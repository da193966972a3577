"""Who a request comes from: behind trusted proxies (addresses or networks) the rightmost X-Forwarded-For hop that is
no proxy, IPv6 clients by their /64, wrong keys throttled per address before any key is compared."""

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.serve import ServeConfig, create_app  # noqa: E402
from nanomt.serve.access import KEY_ATTEMPTS, grouped  # noqa: E402
from nanomt.serve.keys import key_line  # noqa: E402


@pytest.fixture(scope="module")
def translator(served_run):
    return Translator.from_checkpoint(served_run)


def statuses(client: TestClient, forwarded: list[str]) -> list[int]:
    body = {"text": ["la nuka."]}
    return [client.post("/translate", json=body, headers={"x-forwarded-for": f}).status_code for f in forwarded]


def test_the_client_is_the_rightmost_hop_no_proxy_wrote_not_what_the_client_wrote(translator):
    app = create_app(translator, req_limit=2, forwarded_allow_ips="*", access_log=False)
    with TestClient(app) as client:
        # A client writing a new address at the left of the header each time is still the address nginx appended.
        forged = [f"198.51.100.{i}, 203.0.113.7" for i in range(4)]
        assert statuses(client, forged) == [200, 200, 429, 429]  # before: each forged address had its own limit
        assert statuses(client, ["203.0.113.8"]) == [200]


def test_proxies_given_as_networks_and_ipv6_clients_by_their_64(translator):
    config = ServeConfig(req_limit=1, forwarded_allow_ips="10.0.0.0/8, 192.0.2.1", access_log=False)
    with TestClient(create_app(translator, config), client=("10.1.2.3", 40000)) as client:
        # Both hops after the client are proxies of the trusted network: the client is 7.7.7.7.
        assert statuses(client, ["7.7.7.7, 10.9.9.9", "7.7.7.7, 10.200.0.1"]) == [200, 429]
        # One subscriber's /64 is one client; the next /64 another.
        assert statuses(client, ["2001:db8:0:1::1", "2001:db8:0:1:ffff::2", "2001:db8:0:2::1"]) == [200, 429, 200]
    with TestClient(create_app(translator, config), client=("172.16.0.1", 40000)) as client:
        assert statuses(client, ["7.7.7.7", "8.8.8.8"]) == [200, 429]  # not a proxy: its header is ignored
    assert grouped("2001:db8::1") == grouped("2001:db8::ffff") == "2001:db8::/64"
    assert grouped("::ffff:192.0.2.9") == "192.0.2.9" and grouped("192.0.2.9") == "192.0.2.9"


def test_wrong_keys_are_throttled_per_address_before_any_key_is_compared(translator, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(key_line("right-key", "alice") + "\n")
    app = create_app(translator, keys_file=str(keys), access_log=False)
    with TestClient(app) as attacker, TestClient(app, client=("192.0.2.50", 1)) as other:
        post = lambda c, key: c.post("/translate", json={"text": ["la."]}, headers={"x-api-key": key})  # noqa: E731
        wrong = [post(attacker, f"guess-{i}").status_code for i in range(KEY_ATTEMPTS)]
        assert wrong == [403] * KEY_ATTEMPTS
        refused = post(attacker, "right-key")  # the right key too: a guesser learns nothing more this minute
        assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60, refused.text
        assert post(other, "right-key").status_code == 200  # another address is not held back
        assert attacker.post("/translate", json={"text": ["la."]}).status_code == 403  # no key: not a guess
