import dataclasses
import http.server
import threading

import pytest

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.cost import (NO_BASIS_CLI_HINT, PRICE_TABLE, instance_type_from_imds, price_advice,
                                        resolve_cost_basis, trial_cost_usd, usd_per_1m_samples)


def test_share_is_cores_held_over_cores_on_the_instance():
    basis, _ = resolve_cost_basis("trn1.32xlarge", detect=False)
    resources = {"CPU": 1, "neuron_cores": 2}
    assert basis.share(resources) == pytest.approx(2 / 32)
    assert basis.hourly_rate(resources) == pytest.approx(21.50 * 2 / 32)
    assert "x 2/32 neuron_cores" in basis.describe(resources)


def test_cpu_trials_pay_for_their_vcpus():
    basis, _ = resolve_cost_basis("c7i.2xlarge", detect=False)
    assert basis.hourly_rate({"CPU": 2}) == pytest.approx(0.357 * 2 / 8)


def test_dollars_per_million_samples_and_per_trial():
    # CPU post: 40.73 samples/s on a $0.357/h c7i.2xlarge.
    assert usd_per_1m_samples(0.357, 40.73) == pytest.approx(0.357 / 3600 / 40.73 * 1e6)
    assert usd_per_1m_samples(0.357, 0.0) != usd_per_1m_samples(0.357, 0.0)  # NaN, not inf
    assert trial_cost_usd(1.34, 1800) == pytest.approx(0.67)


def test_price_per_hour_wins_and_uses_local_units():
    basis, note = resolve_cost_basis(price_per_hour=0.357, local_units={"CPU": 2}, detect=False, flags=True)
    assert basis.usd_per_hour == 0.357 and basis.hourly_rate({"CPU": 2}) == pytest.approx(0.357)
    assert "command line" in note and basis.source == "--price-per-hour"
    basis, note = resolve_cost_basis(price_per_hour=0.357, detect=False)  # from Python: no command line
    assert note == "price basis: $0.357/h given" and basis.source == "price_per_hour"


def test_no_basis_is_nan_with_a_hint_not_a_guess():
    basis, note = resolve_cost_basis(detect=False, flags=True)
    assert basis is None
    assert "--instance-type" in note and "--price-per-hour" in note


def test_a_sweep_run_from_python_is_told_how_to_price_it_in_the_apis_terms():
    """A script calling run_sweep has no --instance-type: the Sweep's default note and
    resolve_cost_basis without flags name the Sweep's fields and the function that fills
    them, and the CLI's cost_basis keeps the flags."""
    import argparse

    from accelsweep import Sweep
    from accelsweep.sweeps.driver.define.cli import cost_basis

    _, note = resolve_cost_basis(detect=False)
    default_note = next(f.default for f in dataclasses.fields(Sweep) if f.name == "cost_note")
    for said in (note, default_note):
        assert "--" not in said, said
        assert "cost=" in said and "cost_note=" in said and "resolve_cost_basis(instance_type=" in said
        assert "resolve_cost_basis(price_per_hour=" in said and all(name in said for name in PRICE_TABLE)
    assert price_advice(note).startswith("Give the Sweep one: ")
    _, flags_note = cost_basis(argparse.Namespace(instance_type=None, price_per_hour=None))
    assert flags_note == NO_BASIS_CLI_HINT and price_advice(flags_note).startswith("Pass --instance-type")
    with pytest.raises(ConfigError, match=r"instance_type must be one of .* \(or give price_per_hour\); got 'p9'"):
        resolve_cost_basis("p9", detect=False)


def test_unknown_instance_without_price_is_refused():
    with pytest.raises(ConfigError, match="instance_type must be one of .*trn1.2xlarge.*got 'p9.huge'"):
        resolve_cost_basis("p9.huge", detect=False)


def test_bad_price_is_refused():
    with pytest.raises(ConfigError, match="price_per_hour must be a finite number > 0; got -1"):
        resolve_cost_basis(price_per_hour=-1.0, detect=False)


def test_every_price_row_has_cpus_and_a_price():
    for name, row in PRICE_TABLE.items():
        assert row.usd_per_hour > 0 and row.vcpus > 0, name


class FakeImds(http.server.BaseHTTPRequestHandler):
    """IMDSv2 on loopback: a PUT for a token, then a GET that must present it."""

    def do_PUT(self):
        self._reply(b"token-123" if self.path == "/latest/api/token" else None)

    def do_GET(self):
        ok = self.path == "/latest/meta-data/instance-type" and self.headers.get(
            "X-aws-ec2-metadata-token") == "token-123"
        self._reply(b"inf2.xlarge" if ok else None)

    def _reply(self, body):
        self.send_response(200 if body else 401)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_instance_type_from_imds_v2():
    server = http.server.HTTPServer(("127.0.0.1", 0), FakeImds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert instance_type_from_imds(f"http://127.0.0.1:{server.server_port}") == "inf2.xlarge"
    finally:
        server.shutdown()


def test_imds_timeout_gives_none():
    # A listening socket that never answers: the short timeout must end the wait.
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        assert instance_type_from_imds(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.2) is None
    finally:
        silent.close()


def test_a_sweep_given_a_basis_without_its_note_says_the_basis_not_that_there_is_none():
    from accelsweep import Sweep
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.cost import NO_BASIS, CostBasis

    basis = CostBasis(0.5, {"CPU": 2.0}, "my quote")
    sweep = Sweep(name="priced", trainable=lambda searched, base, cost=None: None, base=TrialConfig.make(),
                  space=lambda trial: None, cost=basis)
    assert sweep.cost_note == "price basis: this machine at $0.5/h (my quote)"
    assert NO_BASIS in Sweep(name="free", trainable=lambda searched, base, cost=None: None, base=TrialConfig.make(),
                             space=lambda trial: None).cost_note
