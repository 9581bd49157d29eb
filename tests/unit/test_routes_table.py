"""A dead route policy routing picked from another table (`ip rule ... lookup 100`): its fix
deletes it from that table. `ip route get` names the table (node/facts/network.py reads it);
`ip route del` without it looks in the main table alone and fails there ("No such process")."""

from rules.facts.network import Route
from rules.routes import drop_route


def test_a_dead_route_from_another_table_is_deleted_from_that_table():
    route = Route("10.213.0.200", "10.213.0.200", "eth1", prefix="10.213.0.200", flags=("linkdown",), table="100")
    assert drop_route("worker1", route).text() == \
        "on worker1: sudo ip route del 10.213.0.200 dev eth1 table 100   # or bring eth1 up"


def test_one_from_the_main_table_names_none():
    route = Route("10.213.0.200", "10.213.0.200", "eth1", prefix="10.213.0.200", flags=("linkdown",))
    assert drop_route("worker1", route).text() == "on worker1: sudo ip route del 10.213.0.200 dev eth1   # or bring eth1 up"
