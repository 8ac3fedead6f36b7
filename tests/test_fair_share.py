"""Several sweeps on one cluster take turns (sweeps/driver/run/fair_share.py): the rule that
gives a freed seat, one driver's gate (its waits, its reuse of a trial's process), and Tune's
loop as a sweep that shares a cluster runs it. The sweeps themselves, two drivers on one
cluster of namespace hosts: tests/test_cluster_hosts.py."""

from __future__ import annotations

from accelsweep.sweeps.driver.run import fair_share
from accelsweep.sweeps.driver.run.fair_share import Gate, Seats

TWO_CPUS = {"CPU": 2.0}
CLUSTER = {"CPU": 4.0}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ask(seats, token, trial, free=CLUSTER, shape=TWO_CPUS):
    return seats.ask(token, token.upper(), f"job-{token}", trial, shape, CLUSTER, free)


def test_a_sweep_alone_is_never_held_back_not_even_past_the_clusters_resources():
    seats = Seats(Clock())
    assert all(ask(seats, "a", f"t{i}", free={"CPU": 0.0}).granted for i in range(3))


def test_a_freed_seat_goes_to_the_sweep_holding_fewest_not_to_the_one_that_freed_it():
    clock = Clock()
    seats = Seats(clock)
    assert ask(seats, "a", "a1").granted and ask(seats, "a", "a2").granted  # alone: both slots
    seats.placed("a", "a1"), seats.placed("a", "a2")
    clock.now += 1
    assert not ask(seats, "b", "b1", free={"CPU": 0.0}).granted  # b waits: nothing free
    seats.release("a", "a1")
    clock.now += 1
    answer = ask(seats, "a", "a3", free={"CPU": 2.0})
    assert not answer.granted and answer.waiting == 1  # a holds one, b none: b's turn
    assert ask(seats, "b", "b1", free={"CPU": 2.0}).granted


def test_of_two_holding_as_few_the_one_whose_seats_were_held_for_less_time_goes_first():
    """Slot time, not turns: a sweep of short trials is served as often as its trials are
    short, so each sweep gets about an equal share of the slots' time (a's trial held its
    seat 11 s, b's 2 s: b goes first, though a asked first)."""
    clock = Clock()
    seats = Seats(clock)
    assert ask(seats, "c", "c1").granted  # c holds a seat throughout
    seats.placed("c", "c1")
    assert ask(seats, "a", "a1", free={"CPU": 2.0}).granted  # at 100
    seats.placed("a", "a1")
    clock.now += 2
    assert ask(seats, "b", "b1", free={"CPU": 2.0}).granted  # joins level with a (2 s): at 102
    seats.placed("b", "b1")
    clock.now += 2
    seats.release("b", "b1")  # b: 2 + 2 = 4 s
    clock.now += 7
    seats.release("a", "a1")  # a: 11 s
    assert not ask(seats, "a", "a2", free={"CPU": 0.0}).granted  # a asks first; Ray has not freed a1 yet
    clock.now += 0.5
    assert not ask(seats, "b", "b2", free={"CPU": 0.0}).granted
    answer = ask(seats, "a", "a2", free={"CPU": 2.0})
    assert not answer.granted and "B holds fewer seats or has held them for less time" in answer.why
    assert ask(seats, "b", "b2", free={"CPU": 2.0}).granted


def test_a_sweep_that_joins_late_starts_level_and_does_not_take_every_seat():
    """Two sweeps have held seats for 50 s each; a third that joins now is not owed 50 s: of
    two holding none, the one that asked first goes first."""
    clock = Clock()
    seats = Seats(clock)
    for token in ("a", "b"):
        assert ask(seats, token, f"{token}1", free={"CPU": 2.0}).granted
        seats.placed(token, f"{token}1")
    clock.now += 50
    seats.release("a", "a1")  # a: 50 s; b holds its seat (50 s so far)
    assert not ask(seats, "a", "a2", free={"CPU": 0.0}).granted  # a asks first (c is not here yet)
    assert not ask(seats, "c", "c1", free={"CPU": 0.0}).granted  # c joins level: 50 s, as a and b
    assert not ask(seats, "c", "c1", free={"CPU": 2.0}).granted  # a asked before c
    assert ask(seats, "a", "a2", free={"CPU": 2.0}).granted


def test_a_seat_is_given_only_where_ray_has_room_less_the_seats_not_placed_yet():
    clock = Clock()
    seats = Seats(clock)
    ask(seats, "a", "a1")  # alone: granted, not placed yet
    clock.now += 1
    # Ray shows 4 CPUs free (a1 is not placed), but a1 is promised 2 of them; b gets the other 2.
    assert ask(seats, "b", "b1", free=CLUSTER).granted
    clock.now += 1
    assert not ask(seats, "c", "c1", free=CLUSTER).granted  # 4 free, 4 promised
    seats.placed("a", "a1")
    seats.placed("b", "b1")
    assert not ask(seats, "c", "c1", free={"CPU": 0.0}).granted  # placed: Ray's own count has them
    assert ask(seats, "c", "c1", free={"CPU": 2.0}).granted  # something else ended: room


def test_with_nothing_held_one_seat_is_given_on_an_empty_cluster_for_the_autoscaler():
    clock = Clock()
    seats = Seats(clock)
    none: dict = {}  # no node with a CPU: an autoscaling cluster's workers all gone
    assert seats.ask("a", "A", "job-a", "a0", TWO_CPUS, none, none).granted  # alone
    clock.now += 1
    assert not seats.ask("b", "B", "job-b", "b0", TWO_CPUS, none, none).granted  # a holds a0
    seats.release("a", "a0")
    clock.now += 1
    assert not seats.ask("a", "A", "job-a", "a1", TWO_CPUS, none, none).granted  # b's turn
    # Nothing fits, but nothing is held: one trial, for the autoscaler to start a node for...
    assert seats.ask("b", "B", "job-b", "b1", TWO_CPUS, none, none).granted
    clock.now += 1
    # ...and not a second one into Ray's queue.
    assert not seats.ask("a", "A", "job-a", "a1", TWO_CPUS, none, none).granted


def test_sweeps_sharing_an_autoscaling_cluster_get_seats_in_what_it_can_still_add_and_no_more():
    """Four sweeps on a head with no worker up, whose autoscaler may add 4 CPUs: two trials
    of two sweeps get seats (their demand makes it add the nodes), the others wait, and no
    seat is given past what it can add."""
    clock = Clock()
    seats = Seats(clock)
    none: dict = {}
    room = {"CPU": 4.0}

    def ask_room(token, trial, free=none, can_add=room):
        clock.now += 1
        return seats.ask(token, token.upper(), f"job-{token}", trial, TWO_CPUS, none, free, can_add)

    assert ask_room("a", "a1").granted  # alone
    assert ask_room("b", "b1").granted  # 4 CPUs can be added, 2 are promised to a1
    assert not ask_room("c", "c1").granted  # 4 promised, none placed: no more
    assert not ask_room("d", "d1").granted
    # a1's node is up: 2 CPUs there, all a1's; the autoscaler can add 2 more, promised to b1.
    seats.placed("a", "a1")
    up = {"CPU": 2.0}
    assert not seats.ask("c", "C", "job-c", "c1", TWO_CPUS, up, {"CPU": 0.0}, {"CPU": 2.0}).granted
    # Without the autoscaler's room only the one seat for its demand is given (as before).
    plain = Seats(Clock())
    assert plain.ask("a", "A", "job-a", "a1", TWO_CPUS, none, none).granted
    assert not plain.ask("b", "B", "job-b", "b1", TWO_CPUS, none, none).granted


def test_a_dead_drivers_seats_are_freed():
    clock = Clock()
    seats = Seats(clock)
    ask(seats, "a", "a1")
    ask(seats, "a", "a2")
    clock.now += 1
    assert not ask(seats, "b", "b1", free={"CPU": 0.0}).granted
    assert seats.keep_jobs({"job-b"}) == ["a"]
    assert ask(seats, "b", "b1", free={"CPU": 0.0}).granted  # alone now


class FakeArbiter:
    """The actor's methods, served by a Seats in this process (the gate calls ``.remote``)."""

    def __init__(self, seats, free):
        self.seats, self.free = seats, free
        outer = self

        class Method:
            def __init__(self, name):
                self.name = name

            def remote(self, *args):
                if self.name == "ask":
                    token, label, job, trial_id, shape = args
                    return outer.seats.ask(token, label, job, trial_id, shape, CLUSTER, outer.free)
                if self.name == "status":
                    return outer.seats.status(args[0], CLUSTER)
                return getattr(outer.seats, self.name)(*args)

        for name in ("ask", "placed", "release", "leave", "status"):
            setattr(self, name, Method(name))


def gate_on(seats, token, free, clock, said):
    gate = Gate(FakeArbiter(seats, free), token, token.upper(), f"job-{token}", TWO_CPUS, said.append, clock)
    gate._call = lambda method, *args, timeout=0: getattr(gate.arbiter, method).remote(*args)
    return gate


def test_a_gate_counts_its_wait_only_while_none_of_its_trials_has_a_place_and_says_whom_it_waits_for():
    clock = Clock()
    seats = Seats(clock)
    said: list[str] = []
    a = gate_on(seats, "a", {"CPU": 4.0}, clock, said)
    b = gate_on(seats, "b", {"CPU": 0.0}, clock, said)
    assert a.may_create("a1") and a.may_create("a2")
    a.placed("a1"), a.placed("a2")
    for _ in range(4):  # b asks in vain every second
        clock.now += 1.0
        assert not b.may_create("b1")
    assert b.waited_s == 3.0
    assert any("waiting for a place" in line and "A 2" in line for line in said)
    assert a.waited_s == 0.0
    b.arbiter.free = {"CPU": 2.0}
    a.release("a1")
    clock.now += 1.0
    assert b.may_create("b1")
    assert b.waited_s == 4.0  # up to its seat
    clock.now += 5.0
    b.placed("b1")
    clock.now += 10.0
    b.refresh()
    assert b.waited_s == 4.0  # its trial's placement and process start are its wait_s; then the budget's


def test_a_trials_process_is_reused_only_while_no_other_sweep_waits():
    clock = Clock()
    seats = Seats(clock)
    said: list[str] = []
    a = gate_on(seats, "a", {"CPU": 0.0}, clock, said)
    fair_share._GATES["a"] = a
    try:
        assert a.may_create("a1")
        a.placed("a1")
        clock.now += 1
        assert fair_share.reuse_ok()
        b = gate_on(seats, "b", {"CPU": 0.0}, clock, said)
        assert not b.may_create("b1")
        clock.now += 1
        assert not fair_share.reuse_ok()
    finally:
        fair_share._GATES.pop("a", None)


def test_waits_stop_a_sweep_only_when_none_of_its_trials_ever_had_a_place(monkeypatch):
    """The budget stopper on a cluster: the sweep's own clock, less its waits. Waits alone
    reaching the budget stop a sweep that never got a place (nothing to wait for longer),
    not one that runs trials between its turns (four sweeps on two slots each wait about
    half their time)."""
    clock = Clock()
    seats = Seats(clock)
    gates = {}
    monkeypatch.setattr(fair_share, "_GATES", gates)
    wall = [1000.0]
    monkeypatch.setattr(fair_share.time, "time", lambda: wall[0])
    for token in ("ran", "never"):
        gates[token] = gate_on(seats, token, {"CPU": 0.0}, clock, [])
    assert gates["ran"].may_create("r1")  # alone: a seat
    gates["ran"].placed("r1")
    stoppers = {token: fair_share.BudgetLessWaits(token, budget_s=100.0) for token in gates}
    for gate in gates.values():
        gate.waited_s = 100.0  # as long as the budget, in turns
    wall[0] += 150.0  # 50 s of the sweep's own clock
    assert not stoppers["ran"].stop_all()
    assert stoppers["never"].stop_all()
    wall[0] += 50.0  # 100 s of its own clock: the budget's end
    assert stoppers["ran"].stop_all()
